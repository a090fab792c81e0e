#!/usr/bin/env python3
"""Convert Hugging Face BERT and ModernBERT checkpoints into packbert's checkpoint layout, and
packbert checkpoints of ModernBERT models into ModernBertForMaskedLM's.

Usage:
    /usr/bin/python3 scripts/convert_hf_checkpoint.py IN_DIR OUT_DIR [--real-vocab-size N]
    /usr/bin/python3 scripts/convert_hf_checkpoint.py --to modernbert PACKBERT_DIR OUT_DIR
        [--pad-token-id N] [--cls-token-id N] [--sep-token-id N]

IN_DIR's config.json decides the way in: model_type "modernbert" is ModernBertForMaskedLM
(section ModernBERT below), anything else BertForPreTraining, as follows.

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

ModernBERT. packbert's pre-norm models carry ModernBertForMaskedLM's tensor names
(src/model/param_names.cpp), so both ways copy the tensors under their names, in packbert's
table order; what changes is config.json:

  * in (model_type "modernbert" -> packbert): the BertConfig form packbert writes (vocab_size
    padded as above, "packbert_real_vocab_size") with "packbert_architecture": norm pre, rope
    (global_rope_theta, local_rope_theta; None: the global one), mlp geglu, bias =
    attention_bias = mlp_bias = classifier_bias, norm_bias, no token types, no NSP head,
    local_window = local_attention and global_every = global_attn_every_n_layers (both 0 / 1
    when no layer is local), layer_norm_eps = norm_eps; dropout 0 (the training config sets
    packbert's); the tokenizer's pad/bos/eos/cls/sep ids are kept for the way back. Refused,
    each named: a hidden_activation other than "gelu", "gelu_new", "gelu_pytorch_tanh", a
    classifier_activation of another GELU than it (packbert has one), biases that differ among
    attention_bias / mlp_bias / classifier_bias, decoder_bias false, tie_word_embeddings false
    (or a decoder.weight unequal to the embeddings), rope_scaling, local_attention 0 with local
    layers, an odd head size. Other fields (classifier_pooling, sparse_prediction, ...) concern
    other heads or only speed.
  * out (--to modernbert): a directory ModernBertForMaskedLM.from_pretrained loads: config.json
    of ModernBertConfig (transformers 4.48) and model.safetensors (no decoder.weight: tied on
    load), with packbert's checksums (config_json_checksum of this config.json, so the
    directory converts back). The vocabulary stays padded (packbert's softmax runs over every
    row); "packbert_real_vocab_size" is written when it differs. Special token ids: the
    options', else those config.json records, else BERT's WordPiece ids ([PAD] 0, [CLS] 101,
    [SEP] 102) for a real vocabulary of 30522 and ModernBERT's (50283, 50281, 50282)
    otherwise. Refused, each named: what ModernBERT cannot express, i.e. model.norm = post,
    position = learned, mlp other than geglu, token_types, nsp_head.

The window of a local layer is Hugging Face's: query i sees key j of its own sequence when
|i - j| <= local_attention // 2, and a layer l is local when l % global_attn_every_n_layers != 0.

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


def bert_to_packbert(args, cfg, cfg_path):
    """BertForPreTraining (or BertModel names) -> packbert's checkpoint layout."""
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
        fail(f"{cfg_path}: model_type {cfg['model_type']!r} is not 'bert' or 'modernbert'")

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


# ---- ModernBERT (ModernBertForMaskedLM) -----------------------------------------------------

# packbert's data is BERT's WordPiece (data/vocab.txt): [PAD] 0, [CLS] 101, [SEP] 102; a model
# of another vocabulary is taken to use ModernBERT's tokenizer (ModernBertConfig's defaults).
BERT_REAL_VOCAB = 30522
BERT_TOKEN_IDS = {"pad": 0, "cls": 101, "sep": 102}
MODERNBERT_TOKEN_IDS = {"pad": 50283, "cls": 50281, "sep": 50282}
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")
# BERT's architecture: what a config.json without "packbert_architecture" has.
BERT_ARCHITECTURE = {"norm": "post", "position": "learned", "rope_theta": 10000.0,
                     "local_rope_theta": 10000.0, "mlp": "gelu", "bias": True, "norm_bias": True,
                     "token_types": True, "local_window": 0, "global_every": 1, "nsp_head": True}


def f32(x):
    """x as packbert keeps it (float32), written as its shortest decimal (json_float in
    src/train/checkpoint_config.cpp)."""
    return float(repr(np.float32(x)))


def gelu_kind(name):
    """'erf' for Hugging Face's "gelu", 'tanh' for "gelu_new" / "gelu_pytorch_tanh", else None."""
    return {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}.get(name)


def modernbert_shapes(m):
    """packbert's parameter table of a ModernBERT model (src/model/params.cpp, with the names of
    src/model/param_names.cpp, which are ModernBertForMaskedLM's), in its order: name -> shape.
    m: the packbert fields of the model (modernbert_model)."""
    h, i, v = m["hidden"], m["intermediate"], m["vocab"]
    out = {}

    def norm(prefix):
        out[prefix + ".weight"] = (h,)
        if m["norm_bias"]:
            out[prefix + ".bias"] = (h,)

    def linear(prefix, rows, cols):
        out[prefix + ".weight"] = (rows, cols)
        if m["bias"]:
            out[prefix + ".bias"] = (rows,)

    out["model.embeddings.tok_embeddings.weight"] = (v, h)
    norm("model.embeddings.norm")
    for layer in range(m["layers"]):
        p = f"model.layers.{layer}."
        linear(p + "attn.Wqkv", 3 * h, h)
        linear(p + "attn.Wo", h, h)
        norm(p + "mlp_norm")
        linear(p + "mlp.Wi", 2 * i, h)
        linear(p + "mlp.Wo", h, i)
        # The norm after layer l is layer l + 1's attention norm (layer 0 has none), or the final
        # one (packbert's pre-norm reads it as layer l's last norm).
        norm(f"model.layers.{layer + 1}.attn_norm" if layer + 1 < m["layers"]
             else "model.final_norm")
    linear("head.dense", h, h)
    norm("head.norm")
    out["decoder.bias"] = (v,)
    return out


def int_field(cfg, cfg_path, key, default=None, minimum=None):
    value = cfg.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        fail(f"{cfg_path}: field '{key}' missing or not an integer")
    if minimum is not None and value < minimum:
        fail(f"{cfg_path}: field '{key}' = {value} must be >= {minimum}")
    return value


def modernbert_model(cfg, cfg_path, real_vocab_size):
    """The packbert model of a ModernBertConfig (a dict), or an error listing every option of it
    that packbert's model does not have."""
    m = {k: int_field(cfg, cfg_path, hf, minimum=1) for k, hf in (
        ("vocab", "vocab_size"), ("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
        ("heads", "num_attention_heads"), ("intermediate", "intermediate_size"))}
    m["positions"] = int_field(cfg, cfg_path, "max_position_embeddings", 8192, minimum=1)
    every = int_field(cfg, cfg_path, "global_attn_every_n_layers", 3, minimum=1)
    window = int_field(cfg, cfg_path, "local_attention", 128, minimum=0)
    refused = []
    act = cfg.get("hidden_activation", "gelu")
    head_act = cfg.get("classifier_activation", "gelu")
    if gelu_kind(act) is None:
        refused.append(f"hidden_activation = {act!r} (packbert's gated MLP is GeGLU: 'gelu', "
                       "'gelu_new' or 'gelu_pytorch_tanh')")
    elif gelu_kind(head_act) != gelu_kind(act):
        refused.append(f"classifier_activation = {head_act!r} with hidden_activation = {act!r} "
                       "(packbert's MLP and MLM head share one GELU)")
    biases = {k: bool(cfg.get(k, False)) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
    if len(set(biases.values())) > 1:
        refused.append(", ".join(f"{k} = {str(b).lower()}" for k, b in biases.items()) +
                       " (packbert's model.bias is one switch for all three)")
    if not cfg.get("decoder_bias", True):
        refused.append("decoder_bias = false (packbert's decoder always has its bias)")
    if not cfg.get("tie_word_embeddings", True):
        refused.append("tie_word_embeddings = false (packbert's decoder is the word embeddings)")
    if cfg.get("rope_scaling"):
        refused.append(f"rope_scaling = {json.dumps(cfg['rope_scaling'])} (packbert's rotary "
                       "embeddings are the unscaled ones)")
    if m["hidden"] % m["heads"] or (m["hidden"] // m["heads"]) % 2:
        refused.append(f"hidden_size {m['hidden']} / num_attention_heads {m['heads']}: rotary "
                       "positions need an even head size")
    # Layer l is local when l % every != 0 (ModernBertAttention); packbert's is_global is the
    # same rule, with local_window 0 for a model whose layers are all global.
    has_local = every > 1 and m["layers"] > 1
    if has_local and window < 1:
        refused.append("local_attention = 0 (packbert's local_window 0 means global attention)")
    if refused:
        fail(f"{cfg_path}: options packbert's model does not have: " + "; ".join(refused))
    global_theta = float(cfg.get("global_rope_theta", 160000.0))
    local_theta = cfg.get("local_rope_theta", 10000.0)
    m.update({
        "real_vocab": real_vocab_size or cfg.get("packbert_real_vocab_size") or m["vocab"],
        "hidden_act": "gelu" if gelu_kind(act) == "erf" else "gelu_new",
        "layer_norm_eps": f32(cfg.get("norm_eps", 1e-5)),
        "bias": biases["attention_bias"],
        "norm_bias": bool(cfg.get("norm_bias", False)),
        "rope_theta": f32(global_theta),
        "local_rope_theta": f32(global_theta if local_theta is None else local_theta),
        "local_window": window if has_local else 0,
        "global_every": every if has_local else 1,
        "token_ids": {k: cfg[k] for k in TOKEN_ID_KEYS if isinstance(cfg.get(k), int)},
    })
    return m


def packbert_config_of(m):
    """config.json of a packbert checkpoint of ModernBERT model m: what write_hf_config
    (src/train/checkpoint_config.cpp) writes for it, key for key, and the tokenizer's ids."""
    a = dict(BERT_ARCHITECTURE)
    a.update(norm="pre", position="rope", rope_theta=m["rope_theta"],
             local_rope_theta=m["local_rope_theta"], mlp="geglu", bias=m["bias"],
             norm_bias=m["norm_bias"], token_types=False, local_window=m["local_window"],
             global_every=m["global_every"], nsp_head=False)
    ids = m["token_ids"]
    c = {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": m["vocab"],
        "hidden_size": m["hidden"],
        "num_hidden_layers": m["layers"],
        "num_attention_heads": m["heads"],
        "intermediate_size": m["intermediate"],
        "hidden_act": m["hidden_act"],
        # Dropout is the training config's choice (model.hidden_dropout, ...); --init-checkpoint
        # does not compare it, and ModernBERT's sites differ from packbert's.
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": m["positions"],
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": m["layer_norm_eps"],
        "pad_token_id": ids.get("pad_token_id", 0),
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "packbert_real_vocab_size": m["real_vocab"],
        "packbert_architecture": a,
    }
    # The tokenizer's special ids (packbert reads none of them): kept for the way back.
    c.update({k: ids[k] for k in TOKEN_ID_KEYS[1:] if k in ids})
    return c


def modernbert_to_packbert(args, cfg, cfg_path):
    """ModernBertForMaskedLM -> packbert's checkpoint layout (the names are the same)."""
    m = modernbert_model(cfg, cfg_path, args.real_vocab_size)
    vocab = m["vocab"]
    if not 1 <= m["real_vocab"] <= vocab:
        fail(f"real vocabulary size {m['real_vocab']} outside [1, vocab_size = {vocab}]")
    sd, source = load_state_dict(args.in_dir)
    wanted = modernbert_shapes(m)
    tensors, unknown, decoder = {}, [], None
    for raw_name, t in sd.items():
        name = raw_name[len("module."):] if raw_name.startswith("module.") else raw_name
        if name.startswith(("embeddings.", "layers.", "final_norm.")):
            name = "model." + name  # a ModernBertModel state dict: the head is then missing
        if name == "decoder.weight":
            decoder = t
            continue
        if name not in wanted:
            unknown.append(raw_name)
            continue
        if name in tensors:
            fail(f"{source}: tensor '{name}' given twice (as '{raw_name}' too)")
        tensors[name] = t
    if unknown:
        fail(f"{source}: tensors not in ModernBertForMaskedLM of {cfg_path}: "
             f"{', '.join(sorted(unknown))}")
    missing = [n for n in wanted if n not in tensors]
    if missing:
        fail(f"{source}: tensors missing: {', '.join(missing)}")
    for name, shape in wanted.items():
        if tuple(tensors[name].shape) != shape:
            fail(f"{source}: tensor '{name}' has shape {list(tensors[name].shape)}, expected "
                 f"{list(shape)} (from {cfg_path})")
        if not tensors[name].is_floating_point():
            fail(f"{source}: tensor '{name}' is {tensors[name].dtype}, not floating point")
    word = "model.embeddings.tok_embeddings.weight"
    if decoder is not None and not torch.equal(decoder.float(), tensors[word].float()):
        fail(f"{source}: 'decoder.weight' differs from '{word}': an untied decoder cannot be "
             "converted")

    out = {n: tensors[n].detach().to(torch.float32).contiguous().numpy() for n in wanted}
    padded = (vocab + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE
    if padded != vocab:  # as the BERT path: zero rows, bias -10000 (the docstring says why)
        out[word] = np.concatenate([out[word], np.zeros((padded - vocab, m["hidden"]),
                                                        np.float32)])
        out["decoder.bias"] = np.concatenate(
            [out["decoder.bias"], np.full((padded - vocab,), PAD_BIAS, np.float32)])
        m["vocab"] = padded
        out = {n: out[n] for n in modernbert_shapes(m)}
    for key in ("attention_dropout", "mlp_dropout", "embedding_dropout"):
        if cfg.get(key, 0.0):
            print(f"note: {cfg_path}: {key} = {cfg[key]} is not converted (packbert's dropout "
                  "is the training config's model.hidden_dropout and model.attention_dropout)")
    write_packbert(args.out_dir, packbert_config_of(m), out)
    print(f"converted {len(out)} tensors from {source} (ModernBERT) to {args.out_dir} "
          f"(vocab {vocab} -> {padded}, real {m['real_vocab']})")


def write_packbert(out_dir, cfg, tensors):
    """config.json and model.safetensors with packbert's checksums (the BERT path's files)."""
    os.makedirs(out_dir, exist_ok=True)
    cfg_text = (json.dumps(cfg, indent=2) + "\n").encode()
    tensors = {n: np.ascontiguousarray(a, dtype=np.float32) for n, a in tensors.items()}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors,
                      {"format": "pt", CONFIG_CHECKSUM: xxhash.xxh3_64(cfg_text).hexdigest()})
    with open(os.path.join(out_dir, "config.json"), "wb") as f:
        f.write(cfg_text)


def packbert_model(cfg, cfg_path):
    """The ModernBERT model of a packbert config.json, or an error listing every option of it
    that ModernBERT cannot express."""
    if cfg.get("model_type", "bert") != "bert":
        fail(f"{cfg_path}: model_type {cfg.get('model_type')!r}: --to modernbert reads a "
             "packbert checkpoint (model_type 'bert' with packbert_architecture)")
    m = {k: int_field(cfg, cfg_path, hf, minimum=1) for k, hf in (
        ("vocab", "vocab_size"), ("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
        ("heads", "num_attention_heads"), ("intermediate", "intermediate_size"),
        ("positions", "max_position_embeddings"))}
    a = dict(BERT_ARCHITECTURE)
    a.update(cfg.get("packbert_architecture", {}))
    act = cfg.get("hidden_act", "gelu")
    refused = []
    if a["norm"] != "pre":
        refused.append(f"model.norm = {a['norm']} (ModernBERT is pre-norm)")
    if a["position"] != "rope":
        refused.append(f"model.position = {a['position']} (ModernBERT has rotary positions and "
                       "no position table)")
    if a["mlp"] != "geglu":
        refused.append(f"model.mlp = {a['mlp']} (ModernBERT's MLP is GeGLU)")
    if a["token_types"]:
        refused.append("model.token_types = true (ModernBERT has no token-type embeddings)")
    if a["nsp_head"]:
        refused.append("model.nsp_head = true (ModernBERT has no pooler or NSP head)")
    if gelu_kind(act) is None:
        refused.append(f"hidden_act = {act!r} (ModernBERT's GELUs: 'gelu', 'gelu_new')")
    if refused:
        fail(f"{cfg_path}: options ModernBERT cannot express: " + "; ".join(refused))
    m.update(bias=bool(a["bias"]), norm_bias=bool(a["norm_bias"]))
    m["real_vocab"] = int_field(cfg, cfg_path, "packbert_real_vocab_size", m["vocab"], minimum=1)
    m["hidden_act"] = "gelu" if gelu_kind(act) == "erf" else "gelu_new"
    m["layer_norm_eps"] = f32(cfg.get("layer_norm_eps", 1e-12))
    m["rope_theta"], m["local_rope_theta"] = f32(a["rope_theta"]), f32(a["local_rope_theta"])
    # packbert's local_window 0 (or a model with no local layer): every layer global.
    local = a["local_window"] > 0 and a["global_every"] > 1 and m["layers"] > 1
    m["local_window"] = a["local_window"] if local else 128  # 128: unused, ModernBERT's default
    m["global_every"] = a["global_every"] if local else 1
    return m


def token_ids(args, cfg, m):
    """pad/bos/eos/cls/sep ids of the exported config: the command line's (--cls-token-id sets
    bos too, --sep-token-id eos), else those config.json records (this converter's import keeps
    them), else the tokenizer's that the vocabulary implies: BERT's WordPiece for its 30522
    tokens (packbert's data), ModernBERT's for any other."""
    base = BERT_TOKEN_IDS if m["real_vocab"] == BERT_REAL_VOCAB else MODERNBERT_TOKEN_IDS
    out = {"pad_token_id": base["pad"], "bos_token_id": base["cls"], "eos_token_id": base["sep"],
           "cls_token_id": base["cls"], "sep_token_id": base["sep"]}
    if "cls_token_id" in cfg:  # recorded by this converter's ModernBERT -> packbert
        out.update({k: cfg[k] for k in TOKEN_ID_KEYS if k in cfg})
    for given, keys in ((args.pad_token_id, ("pad_token_id",)),
                        (args.cls_token_id, ("cls_token_id", "bos_token_id")),
                        (args.sep_token_id, ("sep_token_id", "eos_token_id"))):
        if given is not None:
            out.update(dict.fromkeys(keys, given))
    bad = [f"{k} = {v}" for k, v in out.items()
           if not (isinstance(v, int) and 0 <= v < m["vocab"])]
    if bad:
        fail(f"special token ids outside the vocabulary [0, {m['vocab']}): {', '.join(bad)}; "
             "give --pad-token-id, --cls-token-id and --sep-token-id")
    return out


def modernbert_config_of(m, ids):
    """ModernBertConfig (transformers 4.48, configuration_modernbert.py) of ModernBERT model m."""
    c = {
        "architectures": ["ModernBertForMaskedLM"],
        "model_type": "modernbert",
        "vocab_size": m["vocab"],
        "hidden_size": m["hidden"],
        "intermediate_size": m["intermediate"],
        "num_hidden_layers": m["layers"],
        "num_attention_heads": m["heads"],
        "hidden_activation": m["hidden_act"],
        "max_position_embeddings": m["positions"],
        "initializer_range": 0.02,
        "initializer_cutoff_factor": 2.0,
        "norm_eps": m["layer_norm_eps"],
        "norm_bias": m["norm_bias"],
        "global_rope_theta": m["rope_theta"],
        "local_rope_theta": m["local_rope_theta"],
        "local_attention": m["local_window"],
        "global_attn_every_n_layers": m["global_every"],
        "attention_bias": m["bias"],
        "mlp_bias": m["bias"],
        "classifier_bias": m["bias"],
        "decoder_bias": True,
        "classifier_activation": m["hidden_act"],
        "attention_dropout": 0.0,
        "mlp_dropout": 0.0,
        "embedding_dropout": 0.0,
        "classifier_dropout": 0.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    c.update(ids)
    if m["real_vocab"] != m["vocab"]:
        c["packbert_real_vocab_size"] = m["real_vocab"]
    return c


def packbert_to_modernbert(args, cfg, cfg_path):
    """packbert checkpoint of a ModernBERT model -> ModernBertForMaskedLM.from_pretrained's."""
    m = packbert_model(cfg, cfg_path)
    sd, source = load_state_dict(args.in_dir)
    wanted = modernbert_shapes(m)
    unknown = sorted(n for n in sd if n not in wanted)
    missing = [n for n in wanted if n not in sd]
    if unknown or missing:
        fail(f"{source}: not the parameter table of {cfg_path}: "
             f"unknown {unknown or 'none'}, missing {missing or 'none'}")
    for name, shape in wanted.items():
        if tuple(sd[name].shape) != shape:
            fail(f"{source}: tensor '{name}' has shape {list(sd[name].shape)}, expected "
                 f"{list(shape)} (from {cfg_path})")
    out = {n: sd[n].detach().to(torch.float32).contiguous().numpy() for n in wanted}
    hf = modernbert_config_of(m, token_ids(args, cfg, m))
    write_packbert(args.out_dir, hf, out)
    print(f"exported {len(out)} tensors from {source} to {args.out_dir} (ModernBertForMaskedLM, "
          f"vocab {m['vocab']}, real {m['real_vocab']})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("in_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--to", choices=("packbert", "modernbert"), default="packbert",
                    help="packbert: a Hugging Face BERT or ModernBERT checkpoint into packbert's "
                         "layout (default); modernbert: a packbert checkpoint of a ModernBERT "
                         "model into ModernBertForMaskedLM's")
    ap.add_argument("--real-vocab-size", type=int, default=None,
                    help="tokens of the real vocabulary (default: the unpadded vocab_size)")
    for name in ("pad", "cls", "sep"):
        ap.add_argument(f"--{name}-token-id", type=int, default=None,
                        help=f"--to modernbert: the tokenizer's {name} id (see the docstring)")
    args = ap.parse_args()

    cfg_path = os.path.join(args.in_dir, "config.json")
    if not os.path.isfile(cfg_path):
        fail(f"{cfg_path}: missing")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if args.to == "modernbert":
        packbert_to_modernbert(args, cfg, cfg_path)
    elif cfg.get("model_type") == "modernbert":
        modernbert_to_packbert(args, cfg, cfg_path)
    elif "packbert_architecture" in cfg:
        fail(f"{cfg_path}: a packbert checkpoint of a model with architecture options "
             f"({json.dumps(cfg['packbert_architecture'])}): the BERT conversion reads BERT's; "
             "--to modernbert exports a ModernBERT one")
    else:
        bert_to_packbert(args, cfg, cfg_path)


if __name__ == "__main__":
    main()
