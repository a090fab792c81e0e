#!/usr/bin/env python3
"""Convert a Hugging Face PyTorch BERT checkpoint into packbert's checkpoint layout.

Usage:
    /usr/bin/python3 scripts/convert_hf_checkpoint.py IN_DIR OUT_DIR [--real-vocab-size N]

IN_DIR holds config.json and the weights as model.safetensors or pytorch_model.bin (or their
sharded forms with an *.index.json), e.g. what BertForPreTraining.save_pretrained() writes or
Google's bert-large-uncased from the Hugging Face hub. OUT_DIR receives the two files of a
packbert checkpoint that --init-checkpoint reads (src/train/checkpoint.h):

    model.safetensors  every tensor under its Hugging Face name, PyTorch shape, F32,
                       metadata {"format": "pt"}, and the checksums packbert verifies on load
                       (src/train/safetensors.h: XXH3-64 of every tensor and of the header;
                       "config_json_checksum" of config.json's bytes)
    config.json        the BertConfig of BertForPreTraining, vocab_size padded, plus
                       "packbert_real_vocab_size"

No optimizer state or trainer state is written: training starts fresh from these weights.

Checksums. An input model.safetensors that carries packbert's checksums (a packbert checkpoint,
or this script's output) is verified before anything is converted, and its config.json too: a
mismatch is an error naming the file and the tensor. Needs the xxhash module (Debian's
python3-xxhash, or `pip install xxhash`).

Names. Accepted: BertForPreTraining names ("bert.embeddings...", "cls.predictions..."), names
without the "bert." prefix (a BertModel state dict: then the heads are missing and conversion
fails, naming them), a leading "module." (DistributedDataParallel), and the old TensorFlow-port
LayerNorm names "gamma"/"beta" (-> "weight"/"bias"). Dropped: "position_ids" buffers and the
tied duplicates "cls.predictions.decoder.weight" (= the word embeddings) and
"cls.predictions.decoder.bias" (= cls.predictions.bias); a duplicate that is not equal to what
it is tied to is an error (packbert cannot represent an untied decoder). Any other unknown or
missing tensor, or a tensor of another shape, is an error naming it.

Vocabulary padding. NVIDIA's and MLPerf's BERT (and packbert) pad the vocabulary to a multiple
of 8 (30522 -> 30528) so the MLM decoder GEMM has tensor-core friendly extents. When vocab_size
is not a multiple of 8 the converter appends rows:

  * bert.embeddings.word_embeddings.weight: the padded rows are 0;
  * cls.predictions.bias: the padded entries are -10000.

The decoder shares the word-embedding matrix, so the logit of a padded token j is
h . E_j + b_j = h . 0 + (-10000) = -10000 for every hidden state h, while the logit of a real
token i is h . E_i + b_i exactly as before (no other row takes part in it): the logits over the
real vocabulary are unchanged bit for bit. In the softmax the padded entries contribute
exp(-10000 - max) = 0 (it underflows to exactly 0 in fp32), so the probabilities, the MLM loss
and the predictions over the real vocabulary are unchanged too. No input token and no label is
ever a padded id, so the padded rows receive no gradient (their probability is 0): in training
they stay 0 / -10000 (the bias has no weight decay; decay of a zero row is zero).

packbert_real_vocab_size is written to config.json: the unpadded vocab_size, or the value of the
input config's own packbert_real_vocab_size, or --real-vocab-size when given (e.g. 30522 for
NVIDIA's checkpoints, which are already padded to 30528).

Run with a python that has torch and xxhash (and safetensors for .safetensors inputs): on this
machine /usr/bin/python3.
"""

import argparse
import json
import os
import re
import sys

import numpy as np
import torch

try:
    import xxhash
except ImportError:
    print("convert_hf_checkpoint: error: the xxhash module is missing (Debian: apt install "
          "python3-xxhash; or pip install xxhash): packbert checkpoints carry XXH3-64 checksums",
          file=sys.stderr)
    sys.exit(1)

PAD_MULTIPLE = 8
PAD_BIAS = -10000.0
# packbert's checksums in a safetensors file's __metadata__ (src/train/safetensors.h).
CHECKSUM_ALGORITHM = "xxh3_64"
HEADER_CHECKSUM = "checksum.__header__"
HEADER_CHECKSUM_RE = re.compile(rb'"checksum\.__header__"\s*:\s*"([^"]{16})"')
CONFIG_CHECKSUM = "config_json_checksum"
READ_PIECE = 1 << 24


def fail(msg):
    print(f"convert_hf_checkpoint: error: {msg}", file=sys.stderr)
    sys.exit(1)


def header_checksum(prefix, text, digits_at):
    """XXH3-64 of the 8 length bytes and the header, the header checksum's digits as '0's."""
    return xxhash.xxh3_64(prefix + text[:digits_at] + b"0" * 16 + text[digits_at + 16:]).hexdigest()


def verify_safetensors(path):
    """Checks packbert's checksums of a safetensors file: its header's, then every tensor's.
    Returns the file's __metadata__ and whether it had checksums; exits naming the file and the
    tensor on a mismatch."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        n = int.from_bytes(prefix, "little")
        text = f.read(n)
        if len(prefix) < 8 or len(text) < n:
            fail(f"{path}: damaged: cut short inside its header")
        try:
            header = json.loads(text)
        except ValueError as e:
            fail(f"{path}: damaged: the header is not valid JSON ({e})")
        md = header.get("__metadata__", {})
        sums = {k: v for k, v in md.items() if k == "checksum" or k.startswith("checksum.")}
        if not sums:
            return md, False
        if sums.get("checksum") != CHECKSUM_ALGORITHM:
            fail(f"{path}: damaged header: checksum algorithm {sums.get('checksum')!r}, expected "
                 f"{CHECKSUM_ALGORITHM!r}")
        found = list(HEADER_CHECKSUM_RE.finditer(text))
        stored = md.get(HEADER_CHECKSUM, "")
        if len(found) != 1 or found[0].group(1).decode("latin-1") != stored or \
                not re.fullmatch("[0-9a-f]{16}", stored):
            fail(f"{path}: damaged header: its checksum ({HEADER_CHECKSUM}) is missing or "
                 "malformed")
        got = header_checksum(prefix, text, found[0].start(1))
        if got != stored:
            fail(f"{path}: header is damaged: its checksum is {got}, the header says {stored}")
        start = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            want = sums.get("checksum." + name)
            if want is None:
                fail(f"{path}: tensor '{name}': its checksum is missing")
            begin, end = info["data_offsets"]
            f.seek(start + begin)
            h = xxhash.xxh3_64()
            left = end - begin
            while left > 0:
                piece = f.read(min(left, READ_PIECE))
                if not piece:
                    fail(f"{path}: tensor '{name}': unexpected end of file (truncated?)")
                h.update(piece)
                left -= len(piece)
            if h.hexdigest() != want:
                fail(f"{path}: tensor '{name}' is damaged: its data's checksum is "
                     f"{h.hexdigest()}, the header says {want} ({CHECKSUM_ALGORITHM})")
    return md, True


def write_safetensors(path, tensors, metadata):
    """tensors: name -> contiguous float32 numpy array, written in this order, with packbert's
    checksums (the same bytes packbert's writer produces for the same input)."""
    md = dict(metadata)
    md["checksum"] = CHECKSUM_ALGORITHM
    header = {"__metadata__": md}
    offset = 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        md["checksum." + name] = xxhash.xxh3_64(memoryview(a).cast("B")).hexdigest()
    md[HEADER_CHECKSUM] = "0" * 16
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    prefix = len(text).to_bytes(8, "little")
    at = HEADER_CHECKSUM_RE.search(text).start(1)
    text = text[:at] + header_checksum(prefix, text, at).encode() + text[at + 16:]
    with open(path, "wb") as f:
        f.write(prefix)
        f.write(text)
        for a in tensors.values():
            f.write(memoryview(a).cast("B"))
        f.flush()
        os.fsync(f.fileno())


def expected_shapes(cfg, vocab):
    """Our parameter table (src/model/params.cpp), in its order: name -> PyTorch shape."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    out = {}
    out["bert.embeddings.word_embeddings.weight"] = (vocab, h)
    out["bert.embeddings.position_embeddings.weight"] = (cfg["max_position_embeddings"], h)
    out["bert.embeddings.token_type_embeddings.weight"] = (cfg["type_vocab_size"], h)
    out["bert.embeddings.LayerNorm.weight"] = (h,)
    out["bert.embeddings.LayerNorm.bias"] = (h,)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"bert.encoder.layer.{layer}."
        for qkv in ("query", "key", "value"):
            out[p + f"attention.self.{qkv}.weight"] = (h, h)
        for qkv in ("query", "key", "value"):
            out[p + f"attention.self.{qkv}.bias"] = (h,)
        out[p + "attention.output.dense.weight"] = (h, h)
        out[p + "attention.output.dense.bias"] = (h,)
        out[p + "attention.output.LayerNorm.weight"] = (h,)
        out[p + "attention.output.LayerNorm.bias"] = (h,)
        out[p + "intermediate.dense.weight"] = (i, h)
        out[p + "intermediate.dense.bias"] = (i,)
        out[p + "output.dense.weight"] = (h, i)
        out[p + "output.dense.bias"] = (h,)
        out[p + "output.LayerNorm.weight"] = (h,)
        out[p + "output.LayerNorm.bias"] = (h,)
    out["bert.pooler.dense.weight"] = (h, h)
    out["bert.pooler.dense.bias"] = (h,)
    out["cls.predictions.transform.dense.weight"] = (h, h)
    out["cls.predictions.transform.dense.bias"] = (h,)
    out["cls.predictions.transform.LayerNorm.weight"] = (h,)
    out["cls.predictions.transform.LayerNorm.bias"] = (h,)
    out["cls.predictions.bias"] = (vocab,)
    out["cls.seq_relationship.weight"] = (2, h)
    out["cls.seq_relationship.bias"] = (2,)
    return out


def load_file(path):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file as st_load

        md, checked = verify_safetensors(path)
        if checked:
            print(f"{path}: every checksum matches ({CHECKSUM_ALGORITHM})")
            cfg = os.path.join(os.path.dirname(path), "config.json")
            if CONFIG_CHECKSUM in md and os.path.isfile(cfg):
                with open(cfg, "rb") as f:
                    got = xxhash.xxh3_64(f.read()).hexdigest()
                if got != md[CONFIG_CHECKSUM]:
                    fail(f"{cfg}: damaged (or edited): its checksum is {got}, {path} says "
                         f"{md[CONFIG_CHECKSUM]} ({CHECKSUM_ALGORITHM})")

        return st_load(path, device="cpu")
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:  # torch without weights_only
        sd = torch.load(path, map_location="cpu")
    if isinstance(sd, dict) and "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]  # NVIDIA's training checkpoints: {"model": state_dict, ...}
    if not isinstance(sd, dict):
        fail(f"{path}: not a state dict")
    return sd


def load_state_dict(in_dir):
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if os.path.isfile(os.path.join(in_dir, single)):
            return load_file(os.path.join(in_dir, single)), os.path.join(in_dir, single)
        if os.path.isfile(os.path.join(in_dir, index)):
            with open(os.path.join(in_dir, index)) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            sd = {}
            for s in shards:
                sd.update(load_file(os.path.join(in_dir, s)))
            return sd, os.path.join(in_dir, index)
    fail(f"{in_dir}: no model.safetensors, pytorch_model.bin or sharded index found")


def normalise_name(name):
    if name.startswith("module."):
        name = name[len("module."):]
    if name.startswith(("embeddings.", "encoder.", "pooler.")):
        name = "bert." + name
    if name.endswith(".gamma"):
        name = name[: -len(".gamma")] + ".weight"
    elif name.endswith(".beta"):
        name = name[: -len(".beta")] + ".bias"
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("in_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--real-vocab-size", type=int, default=None,
                    help="tokens of the real vocabulary (default: the unpadded vocab_size)")
    args = ap.parse_args()

    cfg_path = os.path.join(args.in_dir, "config.json")
    if not os.path.isfile(cfg_path):
        fail(f"{cfg_path}: missing")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
        if not isinstance(cfg.get(key), int):
            fail(f"{cfg_path}: field '{key}' missing or not an integer")
    # "gelu" is the exact erf GELU; "gelu_new" and "gelu_pytorch_tanh" the tanh approximation
    # (packbert's model.hidden_act = "gelu_tanh").
    act = cfg.get("hidden_act", "gelu")
    if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        fail(f"{cfg_path}: hidden_act {act!r} is not supported "
             "(only 'gelu', 'gelu_new' or 'gelu_pytorch_tanh')")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        fail(f"{cfg_path}: position_embedding_type {cfg['position_embedding_type']!r} is not "
             "supported (only 'absolute')")
    if cfg.get("model_type", "bert") != "bert":
        fail(f"{cfg_path}: model_type {cfg['model_type']!r} is not 'bert'")

    vocab = cfg["vocab_size"]
    padded = (vocab + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE
    real = args.real_vocab_size or cfg.get("packbert_real_vocab_size") or vocab
    if not 1 <= real <= vocab:
        fail(f"real vocabulary size {real} outside [1, vocab_size = {vocab}]")

    sd, source = load_state_dict(args.in_dir)
    wanted = expected_shapes(cfg, vocab)
    tensors = {}
    decoder = {}
    unknown = []
    for raw_name, t in sd.items():
        name = normalise_name(raw_name)
        if name.endswith("position_ids"):
            continue
        if name in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
            decoder[name] = t
            continue
        if name not in wanted:
            unknown.append(raw_name)
            continue
        if name in tensors:
            fail(f"{source}: tensor '{name}' given twice (as '{raw_name}' too)")
        tensors[name] = t
    if unknown:
        fail(f"{source}: tensors not in BertForPreTraining: {', '.join(sorted(unknown))}")
    if "cls.predictions.bias" not in tensors and "cls.predictions.decoder.bias" in decoder:
        tensors["cls.predictions.bias"] = decoder.pop("cls.predictions.decoder.bias")
    missing = [n for n in wanted if n not in tensors]
    if missing:
        fail(f"{source}: tensors missing: {', '.join(missing)}")
    for name, shape in wanted.items():
        if tuple(tensors[name].shape) != shape:
            fail(f"{source}: tensor '{name}' has shape {list(tensors[name].shape)}, expected "
                 f"{list(shape)} (from {cfg_path})")
        if not tensors[name].is_floating_point():
            fail(f"{source}: tensor '{name}' is {tensors[name].dtype}, not floating point")
    for dup, tied in (("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
                      ("cls.predictions.decoder.bias", "cls.predictions.bias")):
        if dup in decoder and not torch.equal(decoder[dup].float(), tensors[tied].float()):
            fail(f"{source}: '{dup}' differs from '{tied}': an untied decoder cannot be "
                 "converted")

    out = {}
    for name in wanted:
        out[name] = tensors[name].detach().to(torch.float32).contiguous().numpy()
    if padded != vocab:
        h = cfg["hidden_size"]
        emb = out["bert.embeddings.word_embeddings.weight"]
        out["bert.embeddings.word_embeddings.weight"] = np.concatenate(
            [emb, np.zeros((padded - vocab, h), np.float32)])
        bias = out["cls.predictions.bias"]
        out["cls.predictions.bias"] = np.concatenate(
            [bias, np.full((padded - vocab,), PAD_BIAS, np.float32)])

    new_cfg = {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": padded,
        "hidden_size": cfg["hidden_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "intermediate_size": cfg["intermediate_size"],
        "hidden_act": "gelu" if act == "gelu" else "gelu_new",
        "hidden_dropout_prob": cfg.get("hidden_dropout_prob", 0.1),
        "attention_probs_dropout_prob": cfg.get("attention_probs_dropout_prob", 0.1),
        "max_position_embeddings": cfg["max_position_embeddings"],
        "type_vocab_size": cfg["type_vocab_size"],
        "initializer_range": cfg.get("initializer_range", 0.02),
        "layer_norm_eps": cfg.get("layer_norm_eps", 1e-12),
        "pad_token_id": cfg.get("pad_token_id", 0),
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "packbert_real_vocab_size": real,
    }

    os.makedirs(args.out_dir, exist_ok=True)
    cfg_text = (json.dumps(new_cfg, indent=2) + "\n").encode()
    out = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in out.items()}
    write_safetensors(os.path.join(args.out_dir, "model.safetensors"), out,
                      {"format": "pt", CONFIG_CHECKSUM: xxhash.xxh3_64(cfg_text).hexdigest()})
    with open(os.path.join(args.out_dir, "config.json"), "wb") as f:
        f.write(cfg_text)
    print(f"converted {len(out)} tensors from {source} to "
          f"{args.out_dir} (vocab {vocab} -> {padded}, real {real})")


if __name__ == "__main__":
    main()
