#!/usr/bin/env python3
"""Hugging Face ModernBERT and packbert (label e2e; registered in tests/CMakeLists.txt).

    modernbert_hf.py roundtrip HF_ROUNDTRIP_TOOL CONVERT_SCRIPT
    modernbert_hf.py compare HF_ROUNDTRIP_TOOL CONVERT_SCRIPT PACKBERT

roundtrip (scripts/convert_hf_checkpoint.py both ways, and packbert's reading of the result):
1. A random tiny ModernBertForMaskedLM (3 layers, hidden 64, 4 heads, intermediate 96, vocab
   128, local_attention 16, a global layer every 2; norm weights away from 1) -> packbert ->
   ModernBERT: every tensor bitwise the same, the config equivalent (every field the model
   reads), from_pretrained loads it with no missing or unexpected keys and a tied decoder, and
   the reference loss is the same number; packbert reads the packbert checkpoint
   (hf_roundtrip_tool compare: config.json, the parameter table, every tensor and checksum),
   and converting the exported directory back gives bitwise the same checkpoint.
2. The same with biases (attention_bias = mlp_bias = classifier_bias = norm_bias = true), the
   tanh GELU, every layer global and vocab 100, which packbert pads to 104: the real rows come
   back bitwise, the padded ones are 0 and -10000, and the reference loss over the padded
   vocabulary equals the original's (1e-6 relative).
3. --init-checkpoint's check: a ModernBERT of BERT's vocabulary (30522 -> 30528) converted,
   then loaded into the model of a train config whose [model] options match (modernbert-tiny
   with the same sizes; hf_roundtrip_tool init): every tensor with its shape, and config.json
   as packbert itself writes it (but the tokenizer's ids the converter keeps). A config whose
   global_every differs is an error naming packbert_architecture.global_every.
4. Refusals, each naming the option: Hugging Face configs packbert lacks (hidden_activation
   silu, mixed biases, decoder_bias false, untied embeddings, rope_scaling, another head GELU),
   and packbert models ModernBERT cannot express (a BERT checkpoint; a pre-norm model with
   learned positions and an ungated MLP).

compare: on a fixed batch (sequences longer than the window, of several lengths),
- the harness itself, run now: a BERT checkpoint's `packbert eval` loss (the batch written as
  an eval shard) against transformers' BertForPreTraining MLM loss, 1e-5 relative;
- packbert -> ModernBERT: a packbert checkpoint of a tiny ModernBERT config (write-model),
  exported; `packbert eval` against tests/reference/modernbert_reference.py, 1e-5 relative;
- ModernBERT -> packbert: a random tiny ModernBertForMaskedLM converted; the same.
The two ModernBERT comparisons run with every layer global and with a local layer every second
one. `packbert eval` failing on any of these models is a failure of the test.

Exit 77 (ctest: skipped, with the reason printed) only when this python lacks torch, h5py or
transformers >= 4.48.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
try:
    import torch_shims  # noqa: F401  (before transformers' ModernBERT)
    import h5py
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import (BertForPreTraining, ModernBertConfig, ModernBertForMaskedLM)
    from transformers.utils import logging as hf_logging
    import modernbert_reference
except Exception as e:  # noqa: BLE001
    print(f"skipped: {sys.executable} cannot import torch/h5py/transformers' ModernBERT ({e})")
    sys.exit(77)

TOL = 1e-5
# The fields of ModernBertConfig that ModernBertForMaskedLM's forward reads.
MODEL_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "hidden_activation", "norm_eps", "norm_bias",
                "global_rope_theta", "local_rope_theta", "attention_bias", "mlp_bias",
                "classifier_bias", "decoder_bias", "classifier_activation", "attention_dropout",
                "mlp_dropout", "embedding_dropout", "tie_word_embeddings", "pad_token_id",
                "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id",
                "max_position_embeddings")
CLS, SEP = 101, 102


def run(cmd, ok=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if ok and r.returncode != 0:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        raise SystemExit(f"FAILED: {' '.join(cmd)} exited {r.returncode}")
    return r


class Checks:
    def __init__(self):
        self.failed = []

    def __call__(self, ok, what):
        print(f"{'ok' if ok else 'FAIL'}: {what}")
        if not ok:
            self.failed.append(what)
        return ok


def tiny_modernbert(seed, **overrides):
    """A random ModernBertForMaskedLM; norm weights (and biases) perturbed so that a swapped or
    dropped tensor shows."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=128, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              intermediate_size=96, local_attention=16, global_attn_every_n_layers=2,
              max_position_embeddings=512, pad_token_id=0, bos_token_id=CLS % 128,
              eos_token_id=SEP % 128, cls_token_id=CLS % 128, sep_token_id=SEP % 128)
    kw.update(overrides)
    model = ModernBertForMaskedLM(ModernBertConfig(**kw))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def random_batch(rng, real_vocab, lengths=(9, 64, 23, 40, 5, 31)):
    """Samples [CLS] A [SEP] B [SEP] with ids in [103, real_vocab) (or [3, ...) for a small
    vocabulary), 1..8 masked positions each: hf_roundtrip_tool's batch format."""
    low = 103 if real_vocab > 200 else 3
    cls, sep = (CLS, SEP) if real_vocab > 200 else (1, 2)
    samples = []
    for n, length in enumerate(lengths):
        ids = rng.integers(low, real_vocab, size=length)
        a_end = int(rng.integers(2, length - 2))
        ids[0], ids[a_end], ids[-1] = cls, sep, sep
        cand = [i for i in range(1, length - 1) if i != a_end]
        k = int(rng.integers(1, min(8, len(cand)) + 1))
        pos = sorted(int(p) for p in rng.choice(cand, size=k, replace=False))
        samples.append({"id": n, "input_ids": [int(x) for x in ids],
                        "segment_ids": [int(i > a_end) for i in range(length)],
                        "masked_positions": pos,
                        "masked_labels": [int(x) for x in rng.integers(low, real_vocab, size=k)],
                        "nsp_label": int(rng.integers(0, 2))})
    return samples


def write_batch(path, samples, vocab):
    with open(path, "w") as f:
        json.dump({"vocab_size": vocab, "samples": samples}, f)


def config_of(hf_dir):
    with open(os.path.join(hf_dir, "config.json")) as f:
        return json.load(f)


def model_config_diff(a_dir, b_dir, fields):
    """{field: (a's, b's)} where the ModernBertConfigs (defaults filled in) differ."""
    a, b = ModernBertConfig.from_pretrained(a_dir), ModernBertConfig.from_pretrained(b_dir)
    return {k: (getattr(a, k, None), getattr(b, k, None)) for k in fields
            if getattr(a, k, None) != getattr(b, k, None)}


def same_tensors(check, a_dir, b_dir, what, real_vocab=None):
    """Every tensor of a_dir's model.safetensors bitwise in b_dir's (the first real_vocab rows
    of the vocabulary tensors when given; b's padded rows must be 0 / -10000)."""
    a = load_file(os.path.join(a_dir, "model.safetensors"))
    b = load_file(os.path.join(b_dir, "model.safetensors"))
    ok = sorted(a) == sorted(b)
    bad = []
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if real_vocab is not None and name in ("model.embeddings.tok_embeddings.weight",
                                               "decoder.bias"):
            pad = y[real_vocab:]
            want = 0.0 if pad.dim() == 2 else -10000.0
            if not (pad.numel() > 0 and bool(torch.all(pad == want))):
                bad.append(name + " (padded rows)")
            y = y[:real_vocab]
        if x.shape != y.shape or not torch.equal(x, y):
            bad.append(name)
    return check(ok and not bad, f"{what}: {len(a)} tensors bitwise the same"
                 + (f" (differ: {bad}; names {sorted(a)} vs {sorted(b)})" if bad or not ok
                    else ""))


def load_exported(check, hf_dir, what):
    model, info = ModernBertForMaskedLM.from_pretrained(
        hf_dir, attn_implementation="eager", torch_dtype=torch.float32, output_loading_info=True)
    missing, unexpected = set(info["missing_keys"]), set(info["unexpected_keys"])
    embeddings = model.model.embeddings.tok_embeddings.weight
    tied = model.decoder.weight.data_ptr() == embeddings.data_ptr()
    check(missing <= {"decoder.weight"} and not unexpected and not info["mismatched_keys"] and tied,
          f"{what}: from_pretrained: missing {sorted(missing)}, unexpected {sorted(unexpected)}, "
          f"mismatched {info['mismatched_keys']}, decoder tied {tied}")
    return model.eval()


def refused(check, cmd, needles, what):
    r = run(cmd, ok=False)
    named = all(n in r.stderr for n in needles)
    check(r.returncode != 0 and named, f"{what}: exit {r.returncode}, names {needles}: "
          f"{r.stderr.strip()[-400:]}")


def roundtrip(tool, convert, work, seed):
    check = Checks()
    py = sys.executable
    rng = np.random.default_rng(seed)

    # 1: HF -> packbert -> HF, bitwise.
    hf = tiny_modernbert(seed)
    d = {k: os.path.join(work, k) for k in ("hf1", "pb1", "hf1b", "pb1b")}
    hf.save_pretrained(d["hf1"])
    print(run([py, convert, d["hf1"], d["pb1"]]).stdout.strip())
    pb_cfg = config_of(d["pb1"])
    arch = pb_cfg.get("packbert_architecture", {})
    check(arch.get("norm") == "pre" and arch.get("position") == "rope"
          and arch.get("mlp") == "geglu" and arch.get("local_window") == 16
          and arch.get("global_every") == 2 and not arch.get("bias")
          and not arch.get("norm_bias") and not arch.get("token_types")
          and not arch.get("nsp_head") and arch.get("rope_theta") == 160000.0
          and arch.get("local_rope_theta") == 10000.0 and pb_cfg.get("layer_norm_eps") == 1e-5,
          f"packbert config.json's architecture: {arch}, eps {pb_cfg.get('layer_norm_eps')}")
    r = run([tool, "compare", d["pb1"], d["pb1"]], ok=False)
    check(r.returncode == 0 and "no checksums" not in r.stdout + r.stderr,
          f"packbert reads the converted checkpoint: {r.stdout.strip()} {r.stderr.strip()}")
    out = run([py, convert, "--to", "modernbert", d["pb1"], d["hf1b"]]).stdout
    print(out.strip())
    check("every checksum matches" in out, "the export verified packbert's checksums")
    same_tensors(check, d["hf1"], d["hf1b"], "HF -> packbert -> HF")
    diff = model_config_diff(d["hf1"], d["hf1b"],
                             MODEL_FIELDS + ("local_attention", "global_attn_every_n_layers"))
    check(not diff, "HF -> packbert -> HF: the config is the same in every model field"
          + (f" (differ: {diff})" if diff else ""))
    back = load_exported(check, d["hf1b"], "HF -> packbert -> HF")
    batch = random_batch(rng, 128)
    l1, _, z1 = modernbert_reference.mlm_reference(hf, batch)
    l2, _, z2 = modernbert_reference.mlm_reference(back, batch)
    check(l1 == l2 and torch.equal(z1, z2),
          f"reference loss of the original {l1!r} and of the round trip {l2!r}")
    out = run([py, convert, d["hf1b"], d["pb1b"]]).stdout
    r = run([tool, "compare", d["pb1"], d["pb1b"]], ok=False)
    check(r.returncode == 0 and "every checksum matches" in out,
          f"the exported directory converts back to the same checkpoint: {r.stdout.strip()}")

    # 2: biases, the tanh GELU, every layer global, vocab 100 (padded to 104).
    hf = tiny_modernbert(seed + 1, vocab_size=100, attention_bias=True, mlp_bias=True,
                         classifier_bias=True, norm_bias=True, hidden_activation="gelu_new",
                         classifier_activation="gelu_new", global_attn_every_n_layers=1,
                         local_attention=32, global_rope_theta=20000.0, local_rope_theta=None,
                         norm_eps=1e-6)
    d = {k: os.path.join(work, k) for k in ("hf2", "pb2", "hf2b")}
    hf.save_pretrained(d["hf2"])
    print(run([py, convert, d["hf2"], d["pb2"]]).stdout.strip())
    pb_cfg = config_of(d["pb2"])
    arch = pb_cfg["packbert_architecture"]
    check(pb_cfg["vocab_size"] == 104 and pb_cfg["packbert_real_vocab_size"] == 100
          and arch["bias"] and arch["norm_bias"] and arch["local_window"] == 0
          and arch["global_every"] == 1 and arch["local_rope_theta"] == 20000.0
          and pb_cfg["hidden_act"] == "gelu_new" and pb_cfg["layer_norm_eps"] == 1e-6,
          f"packbert config.json with biases: vocab {pb_cfg['vocab_size']} "
          f"({pb_cfg['packbert_real_vocab_size']}), act {pb_cfg['hidden_act']}, {arch}")
    r = run([tool, "compare", d["pb2"], d["pb2"]], ok=False)
    check(r.returncode == 0, f"packbert reads it: {r.stdout.strip()} {r.stderr.strip()}")
    print(run([py, convert, "--to", "modernbert", d["pb2"], d["hf2b"]]).stdout.strip())
    same_tensors(check, d["hf2"], d["hf2b"], "with biases, vocab 100 -> 104 -> HF", real_vocab=100)
    diff = model_config_diff(d["hf2"], d["hf2b"], MODEL_FIELDS)
    got = config_of(d["hf2b"])
    check(set(diff) == {"vocab_size", "local_rope_theta"} and got["vocab_size"] == 104
          and got["packbert_real_vocab_size"] == 100 and got["local_rope_theta"] == 20000.0
          and got["global_attn_every_n_layers"] == 1,
          f"with biases: the config differs only in the padded vocabulary and the explicit "
          f"local theta: {diff}")
    back = load_exported(check, d["hf2b"], "with biases")
    batch = random_batch(rng, 100)
    l1, _, z1 = modernbert_reference.mlm_reference(hf, batch)
    l2, _, z2 = modernbert_reference.mlm_reference(back, batch)
    dz = float((z1 - z2[:, :100]).abs().max() / z1.abs().max())
    check(abs(l1 - l2) <= 1e-6 * abs(l1) and dz <= 1e-6 and bool(torch.all(z2[:, 100:] < -9000)),
          f"with biases: reference loss {l1!r} vs {l2!r} over the padded vocabulary, logits "
          f"{dz:.1e} apart relative to their largest, padded ones {float(z2[:, 100:].max())}")

    # 3: --init-checkpoint's check against a train config's [model].
    hf = tiny_modernbert(seed + 2, vocab_size=30522, max_position_embeddings=1024,
                         bos_token_id=CLS, eos_token_id=SEP, cls_token_id=CLS, sep_token_id=SEP)
    d = {k: os.path.join(work, k) for k in ("hf3", "pb3")}
    hf.save_pretrained(d["hf3"])
    print(run([py, convert, d["hf3"], d["pb3"]]).stdout.strip())
    toml = os.path.join(work, "model.toml")
    sizes = "layers = 3\nhidden = 64\nheads = 4\nintermediate = 96\nlocal_window = 16\n"
    with open(toml, "w") as f:
        f.write(f'[model]\npreset = "modernbert-tiny"\n{sizes}global_every = 2\n')
    written = os.path.join(work, "pb3_config_by_packbert.json")
    r = run([tool, "init", d["pb3"], toml, written], ok=False)
    listed = dict(line.split()[1:3] for line in r.stdout.splitlines() if line.startswith("tensor "))
    with open(os.path.join(d["pb3"], "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    stored = {k: "x".join(str(n) for n in v["shape"]) for k, v in header.items()
              if k != "__metadata__"}
    check(r.returncode == 0 and listed == stored and len(listed) == 23,
          f"--init-checkpoint's load into [model] modernbert-tiny with the same sizes: "
          f"{len(listed)} tensors as stored ({r.stdout.strip().splitlines()[-1:]} "
          f"{r.stderr.strip()[-300:]})")
    if r.returncode == 0:
        ours = config_of(d["pb3"])
        for k in ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
            ours.pop(k, None)
        ours["pad_token_id"] = 0
        with open(written) as f:
            check(json.load(f) == ours and ours["vocab_size"] == 30528,
                  "the converter's config.json is packbert's own (write_hf_config), key for key")
    with open(toml, "w") as f:
        f.write(f'[model]\npreset = "modernbert-tiny"\n{sizes}global_every = 3\n')
    refused(check, [tool, "init", d["pb3"], toml, written],
            ["packbert_architecture.global_every"], "a [model] with another global_every")

    # 4: refusals.
    base = config_of(d["hf3"])
    bad_dir = os.path.join(work, "hf_bad")
    os.makedirs(bad_dir, exist_ok=True)
    os.symlink(os.path.join(d["hf3"], "model.safetensors"),
               os.path.join(bad_dir, "model.safetensors"))
    for change, needle in (({"hidden_activation": "silu"}, "hidden_activation = 'silu'"),
                           ({"attention_bias": True}, "attention_bias = true"),
                           ({"decoder_bias": False}, "decoder_bias = false"),
                           ({"tie_word_embeddings": False}, "tie_word_embeddings = false"),
                           ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
                            "rope_scaling"),
                           ({"classifier_activation": "gelu_new"}, "classifier_activation")):
        with open(os.path.join(bad_dir, "config.json"), "w") as f:
            json.dump({**base, **change}, f)
        refused(check, [py, convert, bad_dir, os.path.join(work, "pb_bad")], [needle],
                f"HF config with {change}")
    ckpt = run([tool, "write", os.path.join(work, "bert"), work]).stdout.strip()
    refused(check, [py, convert, "--to", "modernbert", ckpt, os.path.join(work, "hf_bad_out")],
            ["model.norm = post", "model.position = learned", "model.mlp = gelu",
             "model.token_types = true", "model.nsp_head = true"], "export of a BERT checkpoint")
    with open(toml, "w") as f:
        f.write('[model]\npreset = "tiny"\nnorm = "pre"\nbias = false\nnorm_bias = false\n'
                'token_types = false\nnsp_head = false\n')
    ckpt = run([tool, "write-model", os.path.join(work, "prenorm"), toml]).stdout.strip()
    r = run([py, convert, "--to", "modernbert", ckpt, os.path.join(work, "hf_bad_out")], ok=False)
    check(r.returncode != 0 and "model.position = learned" in r.stderr
          and "model.mlp = gelu" in r.stderr and "model.norm" not in r.stderr
          and "token_types" not in r.stderr,
          f"export of a pre-norm model with learned positions names exactly those: "
          f"{r.stderr.strip()[-300:]}")
    return check.failed


# ---- compare ---------------------------------------------------------------------------------

def write_eval_shard(path, samples):
    """The batch as an eval shard, NVIDIA's fixed format (h5py, as NVIDIA's scripts write it)."""
    n, length = len(samples), max(len(s["input_ids"]) for s in samples)
    p = max(len(s["masked_positions"]) for s in samples)
    cols = {"input_ids": np.zeros((n, length), np.int32),
            "input_mask": np.zeros((n, length), np.int8),
            "segment_ids": np.zeros((n, length), np.int8),
            "masked_lm_positions": np.zeros((n, p), np.int32),
            "masked_lm_ids": np.zeros((n, p), np.int32),
            "next_sentence_labels": np.zeros(n, np.int8)}
    for i, s in enumerate(samples):
        k, m = len(s["input_ids"]), len(s["masked_positions"])
        cols["input_ids"][i, :k] = s["input_ids"]
        cols["input_mask"][i, :k] = 1
        cols["segment_ids"][i, :k] = s["segment_ids"]
        cols["masked_lm_positions"][i, :m] = s["masked_positions"]
        cols["masked_lm_ids"][i, :m] = s["masked_labels"]
        cols["next_sentence_labels"][i] = s["nsp_label"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        for name, data in cols.items():
            f.create_dataset(name, data=data)


def packbert_eval(packbert, ckpt, work, samples, name):
    """`packbert eval` of ckpt on the batch: its eval JSON; exits failing when eval fails."""
    eval_dir = os.path.join(work, name + "_eval")
    write_eval_shard(os.path.join(eval_dir, "eval.h5"), samples)
    toml = os.path.join(work, name + "_eval.toml")
    with open(toml, "w") as f:
        f.write(f'[model]\npreset = "modernbert-tiny"\n[train]\nmax_seq_len = 64\n'
                f'max_predictions_per_seq = 8\n[data]\neval_dir = "{eval_dir}"\n'
                f'[eval]\nmax_samples = 0\nbatch_size = 4\n')
    r = run([packbert, "eval", "--config", toml, "--checkpoint", ckpt], ok=False)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"FAILED: packbert eval of {ckpt} exited {r.returncode}")
    at = r.stdout.index('{"checkpoint"')
    return json.loads(r.stdout[at:r.stdout.index("\n", at)])


def close(check, ours, ref, what):
    rel = abs(ours - ref) / abs(ref)
    return check(np.isfinite(ours) and np.isfinite(ref) and rel <= TOL,
                 f"{what}: packbert {ours!r}, reference {ref!r}, rel {rel:.2e} (tol {TOL})")


def compare_modernbert(check, tool, convert, packbert, work, seed, rng, label, window,
                       every):
    """packbert's eval against the reference both ways, for a tiny ModernBERT whose layers l with
    l % every != 0 are local with this window (every 1: all global)."""
    # packbert -> ModernBERT.
    py = sys.executable
    work = os.path.join(work, f"w{window}g{every}")
    os.makedirs(work)
    toml = os.path.join(work, "modernbert.toml")
    with open(toml, "w") as f:
        f.write('[model]\npreset = "modernbert-tiny"\nlayers = 3\nhidden = 64\nheads = 4\n'
                f'intermediate = 96\nlocal_window = {window}\nglobal_every = {every}\n')
    ckpt = run([tool, "write-model", os.path.join(work, "ours"), toml]).stdout.strip()
    hf_dir = os.path.join(work, "ours_hf")
    print(run([py, convert, "--to", "modernbert", ckpt, hf_dir]).stdout.strip())
    model = load_exported(check, hf_dir, f"packbert -> ModernBERT ({label})")
    samples = random_batch(rng, 30522)
    ref, hf_loss, _ = modernbert_reference.mlm_reference(model, samples)
    check(np.isfinite(ref) and abs(ref - hf_loss) <= 1e-6 * ref,
          f"reference loss {ref!r} (transformers' own {hf_loss!r})")
    got = packbert_eval(packbert, ckpt, work, samples, "ours")
    close(check, got["eval_loss"], ref, f"packbert -> ModernBERT ({label}): MLM loss")

    # ModernBERT -> packbert.
    hf = tiny_modernbert(seed, vocab_size=30522, max_position_embeddings=1024, bos_token_id=CLS,
                         eos_token_id=SEP, cls_token_id=CLS, sep_token_id=SEP,
                         local_attention=max(window, 16), global_attn_every_n_layers=every)
    hf_dir, ckpt = os.path.join(work, "theirs_hf"), os.path.join(work, "theirs")
    hf.save_pretrained(hf_dir)
    print(run([py, convert, hf_dir, ckpt]).stdout.strip())
    ref, _, _ = modernbert_reference.mlm_reference(hf, samples)
    got = packbert_eval(packbert, ckpt, work, samples, "theirs")
    close(check, got["eval_loss"], ref, f"ModernBERT -> packbert ({label}): MLM loss")


def compare(tool, convert, packbert, work, seed):
    check = Checks()
    py = sys.executable
    rng = np.random.default_rng(seed)

    # The harness on BERT, which packbert runs today.
    ckpt = run([tool, "write", os.path.join(work, "bert"), work]).stdout.strip()
    with open(os.path.join(work, "batch.json")) as f:
        samples = json.load(f)["samples"]
    bert = BertForPreTraining.from_pretrained(ckpt).eval()
    n, length = len(samples), max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(n, length, dtype=torch.long)
    seg, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, s in enumerate(samples):
        k = len(s["input_ids"])
        ids[i, :k], seg[i, :k], mask[i, :k] = (torch.tensor(s["input_ids"]),
                                               torch.tensor(s["segment_ids"]), 1)
    rows = [(i, p, lab) for i, s in enumerate(samples)
            for p, lab in zip(s["masked_positions"], s["masked_labels"])]
    with torch.no_grad():
        z = bert(input_ids=ids, token_type_ids=seg, attention_mask=mask).prediction_logits
        ref = float(torch.nn.functional.cross_entropy(
            z[[r[0] for r in rows], [r[1] for r in rows]], torch.tensor([r[2] for r in rows])))
    got = packbert_eval(packbert, ckpt, work, samples, "bert")
    close(check, got["eval_loss"], ref, "the harness: BERT MLM loss on the batch")
    check(got["masked_tokens"] == len(rows), f"the harness: {got['masked_tokens']} masked "
          f"tokens evaluated of {len(rows)}")

    # Both directions, with every layer global and with a local layer every second one.
    for label, window, every in (("all global", 0, 1), ("local every 2nd", 16, 2)):
        compare_modernbert(check, tool, convert, packbert, work, seed, rng, label, window, every)
    return check.failed


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if not (mode == "roundtrip" and len(sys.argv) == 4 or mode == "compare" and len(sys.argv) == 5):
        print(__doc__.split("\n\n")[1])
        return 2
    torch.set_num_threads(2)
    hf_logging.set_verbosity_error()
    seed = int(os.environ.get("PACKBERT_TEST_SEED", str(int.from_bytes(os.urandom(4), "little"))))
    print(f"torch {torch.__version__}, seed {seed} (rerun with PACKBERT_TEST_SEED={seed})")
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="packbert-modernbert-") as work:
        if mode == "roundtrip":
            failed = roundtrip(sys.argv[2], sys.argv[3], work, seed)
        else:
            failed = compare(sys.argv[2], sys.argv[3], sys.argv[4], work, seed)
    print(f"{len(failed)} check(s) failed in {time.time() - t0:.1f} s")
    if failed:
        print("FAIL")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
