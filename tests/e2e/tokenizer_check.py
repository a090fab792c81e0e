#!/usr/bin/env python3
"""packbert's tokenizer.json against the `tokenizers` library, id for id.

  tokenizer_check.py PACKBERT CORPUS.txt.gz WORKDIR

Trains a small byte-level BPE (vocabulary 2000, RoBERTa's post-processor) and a small WordPiece
(BERT's normaliser, pre-tokenizer and template; vocabulary 2000) with tokenizers' trainers on
the first lines of the bundled corpus, and a variant of the BPE with the options (NFC, a prefix
space, added tokens with lstrip / rstrip / single_word, a template of its own), writes a test text (other corpus lines and the hard
cases below, as bytes), and compares `packbert tokenize` with `Tokenizer.encode` on every line,
with and without the special tokens. A line's text for `tokenizers` is
bytes.decode("utf-8", errors="replace"), what packbert does with invalid UTF-8. Prints each hard
case with what both give, and exits 1 on any difference (2 without tokenizers).
"""
import gzip
import os
import subprocess
import sys

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
except ImportError as e:
    print(f"tokenizers is not importable by {sys.executable}: {e}", file=sys.stderr)
    sys.exit(2)

# (name, bytes): each is one line of the test text (no b"\n" inside).
HARD = [
    ("accents", "Café naïve résumé Ångström ÉCOLE façade".encode()),
    ("combining marks", "e\u0301 a\u0308 n\u0303 A\u030a \u0301alone".encode()),
    ("CJK", "漢字かな交じり文 中文分词 한국어 テスト".encode()),
    ("emoji", "hi 😀 👍🏽 👨‍👩‍👧 🇫🇷 ❤️".encode()),
    ("RTL", "שלום עולם مرحبا بالعالم ١٢٣".encode()),
    ("whitespace runs", b"a  b   c\t\td \t  e      f"),
    ("unicode spaces", "a\u00a0b\u3000c\u2009d\u200be\u2028f".encode()),
    ("control characters", b"a\x00b\x01c\x7fd\x1be\x0cf\x0bg\rh"),
    ("long word", b"x" * 5000),
    ("long mixed word", ("ab" * 700 + "\u00e9" * 300).encode()),
    ("invalid UTF-8: stray bytes", b"ab\xffcd\xfe ef\x80"),
    ("invalid UTF-8: truncated", b"end \xe2\x82 and \xf0\x9f\x98"),
    ("invalid UTF-8: overlong and surrogate", b"x\xc0\xafy \xed\xa0\x80z"),
    ("literal special tokens", b"the <mask> and </s><s> [MASK] [CLS] tokens"),
    ("numbers and punctuation", b"In 1611, 3.14159 -- (a) [b] {c} \"q\" 'it's' you'll e-mail"),
    ("leading and trailing spaces", b"   padded line   "),
    ("empty line", b""),
    ("only spaces", b"     "),
    ("mixed scripts", "Ελληνικά Кириллица ไทย देवनागरी".encode()),
    ("NFC", "cafe\u0301 A\u030a \u1e9b\u0323 \u212b".encode()),
    ("added tokens", b"thee thereof;thee,  [LS] x   [LS]and ye  said ye\tgo yes thee_ 2thee"),
]


def corpus_lines(path, count, skip):
    out = []
    with gzip.open(path, "rb") as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            line = line.rstrip(b"\n")
            if line:
                out.append(line)
            if len(out) == count:
                break
    return out


def train(corpus):
    texts = [l.decode("utf-8") for l in corpus]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = wp.token_to_id("[CLS]"), wp.token_to_id("[SEP]")
    wp.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    # The options: NFC, a prefix space, added tokens with lstrip, rstrip and single_word (not
    # normalized: packbert refuses normalized added tokens under a normalizer), a template.
    opt = Tokenizer.from_str(bpe.to_str())
    opt.normalizer = normalizers.NFC()
    opt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    opt.add_special_tokens([AddedToken("[LS]", lstrip=True, normalized=False)])
    opt.add_tokens([AddedToken("thee", single_word=True, normalized=False),
                    AddedToken(" ye", rstrip=True, normalized=False)])
    opt.post_processor = processors.TemplateProcessing(
        single="<s> <s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return {"bpe": bpe, "wordpiece": wp, "bpe_options": opt}


def main():
    packbert, corpus_path, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    tokenizers_ = train(corpus_lines(corpus_path, 3000, 0))
    lines = corpus_lines(corpus_path, 1500, 3000) + [b for _, b in HARD]
    text_path = os.path.join(work, "test_text.txt")
    with open(text_path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    failures = 0
    for name, tok in tokenizers_.items():
        path = os.path.join(work, f"{name}.json")
        tok.save(path)
        for special in (False, True):
            cmd = [packbert, "tokenize", "--tokenizer", path, "--input", text_path]
            if special:
                cmd.append("--special")
            got = subprocess.run(cmd, check=True, capture_output=True).stdout.decode().split("\n")
            assert got[-1] == "", "output does not end with a newline"
            got = got[:-1]
            if len(got) != len(lines):
                print(f"{name}: {len(got)} output lines for {len(lines)} input lines")
                failures += 1
                continue
            diff = 0
            for i, (line, out) in enumerate(zip(lines, got)):
                want = tok.encode(line.decode("utf-8", errors="replace"),
                                  add_special_tokens=special).ids
                have = [int(x) for x in out.split()]
                if have != want:
                    diff += 1
                    if diff <= 5:
                        print(f"{name} special={special} line {i + 1}: {line[:80]!r}\n"
                              f"  packbert   {have[:30]}\n  tokenizers {want[:30]}")
            print(f"{name} special={special}: {len(lines)} lines, {diff} differ")
            failures += diff
            if not special:
                for k, (case, b) in enumerate(HARD):
                    ids = [int(x) for x in got[len(lines) - len(HARD) + k].split()]
                    shown = ids if len(ids) <= 12 else ids[:6] + ["..."] + ids[-3:]
                    print(f"  {name} {case}: {len(ids)} ids {shown}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
