#!/usr/bin/env python3
"""Writes the reference ids that tests/unit/test_tokenizer.cpp compares packbert's tokenizer with.

The reference is Hugging Face's *slow* Python BertTokenizer(vocab_file, do_lower_case=True) of
transformers 4.x. Only this script needs it (pip install "transformers<5"; torch is not needed);
CI only reads its outputs in tests/data/. Why not transformers 5: there `BertTokenizer` is the
Rust one, and the Python one, renamed `BertTokenizerLegacy`, no longer lower-cases the text one
character at a time before basic tokenization, so Python's str.lower() applies the Greek
final-sigma rule ("ΟΔΟΣ" -> "οδος" with U+03C2). 4.x slow, and the Rust tokenizer of both
versions, give "οδοσ"; packbert follows them. That is the only difference between 4.57.6 and
5.24.0 on everything below.

Outputs:

  tokenizer_reference_hard.json       one case per hard string of hard_strings.json: the input
                                      bytes (hex), the tokens and the ids; plus versions, hashes
  tokenizer_reference_kjv.txt.gz      line i = space-separated ids of line i of
                                      data/kjv-bible.txt.gz (the whole corpus, ~1.3 MB)
  tokenizer_reference_codepoints.txt.gz
                                      every code point U+0000..U+10FFFF (no surrogates) tokenized
                                      on its own, run-length coded: "first last ids..." in hex
                                      code points; consecutive code points with the same ids
                                      share a line. Lines "cn first last" list the ranges that
                                      Python's Unicode database calls unassigned (category Cn),
                                      so the test can tell Unicode-version differences from bugs.

Literal special tokens: HF maps "[MASK]", "[SEP]", ... inside the text to the special ids.
packbert treats them as plain text, as Google's original tokenization.py does, so text cannot
inject control tokens into pretraining data. For the few hard strings that contain such a
literal, "ids" comes from HF's own pieces with special-token handling off (_tokenize with
split_special_tokens=True after HF's per-character lower-casing; tokenize(text,
split_special_tokens=True) itself does not forward the flag in 4.x) and "ids_hf_default" keeps
HF's default answer. Every other case, the corpus and the code points use plain
tokenizer.tokenize(text); for those the plain path is checked to agree with it. The corpus has
no such literals (asserted below).

Invalid UTF-8 cases (field "utf8_hex" in hard_strings.json) are decoded by Python with
errors="replace" before tokenization: U+FFFD is then dropped by _clean_text.

Usage: python3 tests/reference/make_tokenizer_reference.py   (from anywhere; about a minute)
"""
import argparse
import gzip
import hashlib
import io
import json
import platform
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def slow_bert_tokenizer(vocab_path):
    import transformers
    from transformers import BertTokenizer, PreTrainedTokenizer

    if int(transformers.__version__.split(".")[0]) >= 5:
        sys.exit(f"transformers {transformers.__version__}: the reference needs the slow "
                 'BertTokenizer of transformers 4.x (pip install "transformers<5"); see the doc')
    cls = BertTokenizer
    tok = cls(str(vocab_path), do_lower_case=True, model_max_length=10**9)
    assert isinstance(tok, PreTrainedTokenizer), "need the slow (Python) BertTokenizer"
    return tok, f"transformers.{cls.__name__} (slow, PreTrainedTokenizer)"


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def encode(tok, text):
    """HF's ids without [CLS]/[SEP]: exactly what tokenizer.tokenize gives."""
    return tok.convert_tokens_to_ids(tok.tokenize(text))


def encode_plain(tok, text):
    """The same with special-token literals treated as text (see module doc)."""
    lowered = "".join(ch.lower() for ch in text)  # what tokenize's do_lower_case step does
    return tok.convert_tokens_to_ids(tok._tokenize(lowered, split_special_tokens=True))


def write_gz(path, text):
    # mtime=0 and no file name: the same input gives byte-identical output.
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
            gz.write(text.encode("utf-8"))


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", default=REPO / "data/vocab.txt", type=Path)
    ap.add_argument("--corpus", default=REPO / "data/kjv-bible.txt.gz", type=Path)
    ap.add_argument("--hard", default=REPO / "tests/reference/hard_strings.json", type=Path)
    ap.add_argument("--out", default=REPO / "tests/data", type=Path)
    ap.add_argument("--skip-codepoints", action="store_true", help="the slowest part (~1 min)")
    args = ap.parse_args()

    import transformers

    tok, tok_class = slow_bert_tokenizer(args.vocab)

    # (a) hard strings
    cases = []
    for case in json.loads(args.hard.read_text(encoding="utf-8")):
        if "utf8_hex" in case:
            data = bytes.fromhex(case["utf8_hex"])
            text = data.decode("utf-8", errors="replace")
        else:
            text = case["text"]
            data = text.encode("utf-8")
        hf_ids = encode(tok, text)
        assert hf_ids == tok.encode(text, add_special_tokens=False)
        ids = encode_plain(tok, text)
        if not any(sp in text for sp in SPECIALS):
            assert ids == hf_ids, f"plain path disagrees with HF on {text!r}"
        out = {"note": case["note"], "text": text, "utf8_hex": data.hex(),
               "tokens": tok.convert_ids_to_tokens(ids), "ids": ids}
        if hf_ids != ids:
            out["ids_hf_default"] = hf_ids
        cases.append(out)

    # (b) the whole corpus, line by line (lines split on b"\n" exactly as the C++ test does)
    raw = gzip.decompress(args.corpus.read_bytes())
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    kjv_out = io.StringIO()
    for line in lines:
        text = line.decode("utf-8", errors="replace")
        assert not any(sp in text for sp in SPECIALS), "corpus holds a special-token literal"
        kjv_out.write(" ".join(map(str, encode(tok, text))))
        kjv_out.write("\n")
    kjv_text = kjv_out.getvalue()
    kjv_path = args.out / "tokenizer_reference_kjv.txt.gz"
    write_gz(kjv_path, kjv_text)

    # (c) every code point on its own
    cp_meta = None
    if not args.skip_codepoints:
        cp_out = io.StringIO()
        cp_out.write(f"# unicodedata {unicodedata.unidata_version}; first last ids (hex cps)\n")
        run_start, run_ids, prev = None, None, None

        def flush(last):
            if run_start is not None:
                cp_out.write(f"{run_start:x} {last:x}" + "".join(f" {i}" for i in run_ids) + "\n")

        cn_ranges, cn_start = [], None
        for cp in range(0x110000):
            if 0xD800 <= cp <= 0xDFFF:
                continue  # not encodable in UTF-8
            ch = chr(cp)
            ids = encode(tok, ch)
            if run_start is None or ids != run_ids or prev != cp - 1:
                flush(prev)
                run_start, run_ids = cp, ids
            prev = cp
            is_cn = unicodedata.category(ch) == "Cn"
            if is_cn and cn_start is None:
                cn_start = cp
            if not is_cn and cn_start is not None:
                cn_ranges.append((cn_start, cp - 1))
                cn_start = None
        flush(prev)
        if cn_start is not None:
            cn_ranges.append((cn_start, 0x10FFFF))
        for a, b in cn_ranges:
            cp_out.write(f"cn {a:x} {b:x}\n")
        cp_text = cp_out.getvalue()
        write_gz(args.out / "tokenizer_reference_codepoints.txt.gz", cp_text)
        cp_meta = {"file": "tokenizer_reference_codepoints.txt.gz",
                   "sha256_uncompressed": sha256(cp_text.encode())}

    header = {
        "generator": "tests/reference/make_tokenizer_reference.py",
        "tokenizer": tok_class + ", do_lower_case=True; ids = "
                     "convert_tokens_to_ids(tokenize(text)); special-token literals as text",
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "unicodedata_version": unicodedata.unidata_version,
        "vocab_sha256": sha256(args.vocab.read_bytes()),
        "kjv": {"file": kjv_path.name, "source_sha256": sha256(raw), "lines": len(lines),
                "tokens": sum(len(l.split()) for l in kjv_text.splitlines()),
                "sha256_uncompressed": sha256(kjv_text.encode())},
        "codepoints": cp_meta,
    }
    # One case per line keeps the file diffable; ensure_ascii keeps control characters intact.
    hard_path = args.out / "tokenizer_reference_hard.json"
    with open(hard_path, "w", encoding="ascii") as f:
        body = json.dumps(header, ensure_ascii=True, indent=1)[:-2]
        f.write(body + ',\n "cases": [\n')
        f.write(",\n".join("  " + json.dumps(c, ensure_ascii=True) for c in cases))
        f.write("\n ]\n}\n")
    json.loads(hard_path.read_text())  # well-formed
    print(f"{len(cases)} hard cases, {len(lines)} corpus lines -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
