#!/usr/bin/env python3
"""Hugging Face round trip of packbert checkpoints (label e2e; registered in tests/CMakeLists.txt).

    hf_roundtrip.py HF_ROUNDTRIP_TOOL CONVERT_SCRIPT

1. The tool writes a checkpoint of a random tiny model, a batch and our eval logits on it.
2. transformers' BertForPreTraining.from_pretrained(checkpoint) loads it with no missing or
   unexpected keys but the tied decoder ones, and its logits on the same batch (padded, with an
   attention mask) match ours: MLM at the masked positions over the real vocabulary, NSP;
   max |ours - hf| / max |hf| <= 1e-4.
3. save_pretrained(dir2, safe_serialization=False) -> convert_hf_checkpoint.py -> dir3 holds
   bitwise the weights of step 1 (hf_roundtrip_tool compare).
4. A random HF model with vocab_size 30522 (not a multiple of 8), saved as model.safetensors and
   converted (padded to 30528): our logits from the converted checkpoint match HF's over the
   30522 real entries, and the padded entries are -10000. The same with hidden_act "gelu_new"
   (our model.hidden_act = "gelu_tanh").

5. The converter on old-style names (LayerNorm gamma/beta, "module.", position_ids, the tied
   duplicates) gives bitwise the weights of step 4; a missing tensor and an untied decoder are
   errors naming them.
6. Checksums: every checkpoint the converter writes loads in packbert without the warning of a
   checkpoint without checksums (steps 3-5); converting our own checkpoint verifies its
   checksums and gives bitwise the same weights; one flipped bit in a weight is an error of the
   converter naming the tensor.

Exit 77 (ctest: skipped) when this python lacks torch or transformers.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    from transformers import BertConfig, BertForPreTraining
    from transformers.utils import logging as hf_logging
except Exception as e:  # noqa: BLE001
    print(f"skipped: {sys.executable} cannot import torch/transformers ({e})")
    sys.exit(77)

TOL = 1e-4
TIED = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        raise SystemExit(f"FAILED: {' '.join(cmd)} exited {r.returncode}")
    sys.stderr.write(r.stderr)
    return r.stdout


def load_batch(work):
    with open(os.path.join(work, "batch.json")) as f:
        samples = json.load(f)["samples"]
    n, length = len(samples), max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(n, length, dtype=torch.long)
    seg = torch.zeros(n, length, dtype=torch.long)
    mask = torch.zeros(n, length, dtype=torch.long)
    for i, s in enumerate(samples):
        k = len(s["input_ids"])
        ids[i, :k] = torch.tensor(s["input_ids"])
        seg[i, :k] = torch.tensor(s["segment_ids"])
        mask[i, :k] = 1
    masked = [(i, p) for i, s in enumerate(samples) for p in s["masked_positions"]]
    return ids, seg, mask, masked


def hf_logits(model, work):
    ids, seg, mask, masked = load_batch(work)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=seg, attention_mask=mask)
    rows = torch.tensor([i for i, _ in masked])
    cols = torch.tensor([p for _, p in masked])
    return out.prediction_logits[rows, cols].numpy(), out.seq_relationship_logits.numpy()


def ours(work, prefix, vocab):
    mlm = np.fromfile(os.path.join(work, f"{prefix}_mlm.f32"), dtype=np.float32)
    nsp = np.fromfile(os.path.join(work, f"{prefix}_nsp.f32"), dtype=np.float32)
    return mlm.reshape(-1, vocab), nsp.reshape(-1, 2)


def compare(what, a, b):
    diff = float(np.max(np.abs(a - b)))
    scale = float(np.max(np.abs(b)))
    rel = diff / scale
    ok = np.isfinite(a).all() and np.isfinite(b).all() and rel <= TOL
    print(f"{what}: {a.shape} max abs diff {diff:.3e}, max abs {scale:.3e}, ratio {rel:.3e} "
          f"({'ok' if ok else 'FAIL'}, tol {TOL})")
    return ok


def load(dir_):
    model, info = BertForPreTraining.from_pretrained(dir_, output_loading_info=True)
    missing, unexpected = set(info["missing_keys"]), set(info["unexpected_keys"])
    print(f"from_pretrained({dir_}): missing {sorted(missing)}, unexpected {sorted(unexpected)}, "
          f"mismatched {info['mismatched_keys']}")
    ok = missing <= TIED and not unexpected and not info["mismatched_keys"]
    # The tied decoder really is tied.
    dec = model.cls.predictions.decoder
    ok &= dec.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    ok &= torch.equal(dec.bias, model.cls.predictions.bias)
    return model, ok


def main():
    tool, convert = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    hf_logging.set_verbosity_error()
    seed = int(os.environ.get("PACKBERT_TEST_SEED", str(int.from_bytes(os.urandom(4), "little"))))
    torch.manual_seed(seed)
    print(f"torch {torch.__version__}, seed {seed}")
    t0 = time.time()
    ok = True
    with tempfile.TemporaryDirectory(prefix="packbert-hf-") as work:
        # 1-2: our checkpoint in transformers.
        ckpt = run([tool, "write", os.path.join(work, "ckpt"), work]).strip()
        model, loaded = load(ckpt)
        ok &= loaded
        vocab, real = model.config.vocab_size, model.config.packbert_real_vocab_size
        print(f"config: vocab_size {vocab}, packbert_real_vocab_size {real}")
        hf_mlm, hf_nsp = hf_logits(model, work)
        our_mlm, our_nsp = ours(work, "ours", vocab)
        ok &= compare("MLM logits (ours vs HF, real vocabulary)", our_mlm[:, :real],
                      hf_mlm[:, :real])
        ok &= compare("NSP logits (ours vs HF)", our_nsp, hf_nsp)
        pad_ok = np.allclose(hf_mlm[:, real:], -10000.0, atol=1e-2)
        print(f"HF logits of the padded vocabulary are -10000: {pad_ok}")
        ok &= pad_ok

        # 3: save_pretrained (pytorch_model.bin) -> converter -> bitwise the same weights.
        dir2, dir3 = os.path.join(work, "hf_saved"), os.path.join(work, "converted")
        model.save_pretrained(dir2, safe_serialization=False)
        print(run([sys.executable, convert, dir2, dir3]).strip())
        r = subprocess.run([tool, "compare", ckpt, dir3], capture_output=True, text=True)
        print(f"compare {ckpt} {dir3}: {r.stdout.strip()} {r.stderr.strip()}")
        ok &= r.returncode == 0 and "no checksums" not in r.stdout + r.stderr

        # 4: an HF model with the unpadded vocabulary 30522.
        cfg = BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=512,
                         max_position_embeddings=512, type_vocab_size=2)
        hf = BertForPreTraining(cfg)
        with torch.no_grad():
            for p in hf.parameters():  # biases and LayerNorm weights away from 0 / 1
                p.add_(torch.randn_like(p) * 0.05)
        dir4, dir5 = os.path.join(work, "hf_30522"), os.path.join(work, "hf_30522_converted")
        hf.save_pretrained(dir4)  # model.safetensors
        print(run([sys.executable, convert, dir4, dir5]).strip())
        print(run([tool, "logits", dir5, work, "conv"]).strip())
        hf_mlm, hf_nsp = hf_logits(hf, work)
        our_mlm, our_nsp = ours(work, "conv", 30528)
        ok &= compare("MLM logits (ours from converted 30522 -> 30528 vs HF 30522)",
                      our_mlm[:, :30522], hf_mlm)
        ok &= compare("NSP logits (ours from converted vs HF)", our_nsp, hf_nsp)
        pad = our_mlm[:, 30522:]
        pad_ok = pad.shape[1] == 6 and bool(np.all(pad == -10000.0))
        print(f"our logits of the 6 padded entries are exactly -10000: {pad_ok}")
        ok &= pad_ok

        # 4b: the same weights under hidden_act "gelu_new" (the tanh GELU): the converter keeps
        # it, our model.hidden_act = "gelu_tanh" reads it, and the logits match HF's, closer
        # than HF's tanh-GELU logits are to its erf ones.
        erf_mlm, _ = hf_logits(hf, work)
        cfg_tanh = BertConfig(**{**cfg.to_dict(), "hidden_act": "gelu_new"})
        hf_tanh = BertForPreTraining(cfg_tanh)
        hf_tanh.load_state_dict(hf.state_dict())
        dir6, dir7 = os.path.join(work, "hf_tanh"), os.path.join(work, "hf_tanh_converted")
        hf_tanh.save_pretrained(dir6)
        print(run([sys.executable, convert, dir6, dir7]).strip())
        with open(os.path.join(dir7, "config.json")) as f:
            act = json.load(f)["hidden_act"]
        print(f"converted config.json hidden_act: {act}")
        ok &= act == "gelu_new"
        print(run([tool, "logits", dir7, work, "tanh"]).strip())
        hf_mlm, hf_nsp = hf_logits(hf_tanh, work)
        our_mlm, our_nsp = ours(work, "tanh", 30528)
        ok &= compare("MLM logits, tanh GELU (ours vs HF gelu_new)", our_mlm[:, :30522], hf_mlm)
        ok &= compare("NSP logits, tanh GELU (ours vs HF gelu_new)", our_nsp, hf_nsp)
        scale = float(np.max(np.abs(hf_mlm)))
        err = float(np.max(np.abs(our_mlm[:, :30522] - hf_mlm))) / scale
        apart = float(np.max(np.abs(hf_mlm - erf_mlm))) / scale
        print(f"HF gelu_new vs gelu logits: ratio {apart:.3e}, {apart / err:.0f} times our error "
              "against gelu_new (must exceed 20: the comparison tells the two GELUs apart)")
        ok &= apart > 20 * err

        # 5: the converter on old-style names (LayerNorm gamma/beta, a "module." prefix, a
        # persistent position_ids buffer, the tied decoder duplicates present) gives bitwise
        # the same as step 4; a missing tensor and an untied decoder are errors naming them.
        sd = {}
        for k, v in hf.state_dict().items():
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                         "LayerNorm.beta")
            sd["module." + k] = v.clone()
        sd["module.bert.embeddings.position_ids"] = torch.arange(512).unsqueeze(0)
        sd["module.cls.predictions.decoder.weight"] = hf.bert.embeddings.word_embeddings.weight
        old, old_conv = os.path.join(work, "old_style"), os.path.join(work, "old_style_conv")
        os.makedirs(old)
        cfg.to_json_file(os.path.join(old, "config.json"))
        torch.save(sd, os.path.join(old, "pytorch_model.bin"))
        print(run([sys.executable, convert, old, old_conv]).strip())
        r = subprocess.run([tool, "compare", dir5, old_conv], capture_output=True, text=True)
        print(f"old-style names: {r.stdout.strip()} {r.stderr.strip()}")
        ok &= r.returncode == 0 and "no checksums" not in r.stdout + r.stderr
        for what, key, value in (
                ("missing tensor", "module.bert.pooler.dense.bias", None),
                ("untied decoder", "module.cls.predictions.decoder.weight",
                 hf.bert.embeddings.word_embeddings.weight + 1)):
            bad = dict(sd)
            if value is None:
                del bad[key]
            else:
                bad[key] = value
            torch.save(bad, os.path.join(old, "pytorch_model.bin"))
            r = subprocess.run([sys.executable, convert, old, old_conv + "_bad"],
                               capture_output=True, text=True)
            named = key.replace("module.", "") in r.stderr
            print(f"converter, {what}: exit {r.returncode}, names it: {named}: "
                  f"{r.stderr.strip()[:200]}")
            ok &= r.returncode != 0 and named

        # 6: our own checkpoint through the converter: checksums verified, weights bitwise the
        # same; a flipped bit in a weight is refused, naming the tensor.
        dir8 = os.path.join(work, "ours_converted")
        out = run([sys.executable, convert, ckpt, dir8])
        print(out.strip())
        ok &= "every checksum matches" in out
        r = subprocess.run([tool, "compare", ckpt, dir8], capture_output=True, text=True)
        print(f"compare {ckpt} {dir8}: {r.stdout.strip()} {r.stderr.strip()}")
        ok &= r.returncode == 0 and "no checksums" not in r.stdout + r.stderr
        bad = os.path.join(work, "ours_damaged")
        shutil.copytree(ckpt, bad)
        name = "bert.pooler.dense.weight"
        with open(os.path.join(bad, "model.safetensors"), "r+b") as f:
            n = int.from_bytes(f.read(8), "little")
            begin, end = json.loads(f.read(n))[name]["data_offsets"]
            at = 8 + n + begin + int.from_bytes(os.urandom(4), "little") % (end - begin)
            f.seek(at)
            byte = f.read(1)[0] ^ (1 << (seed % 8))
            f.seek(at)
            f.write(bytes([byte]))
        r = subprocess.run([sys.executable, convert, bad, bad + "_conv"], capture_output=True,
                           text=True)
        named = f"tensor '{name}' is damaged" in r.stderr
        print(f"converter, a flipped bit in {name}: exit {r.returncode}, names it: {named}: "
              f"{r.stderr.strip()[:300]}")
        ok &= r.returncode != 0 and named and not os.path.exists(bad + "_conv")
    print(f"{'PASS' if ok else 'FAIL'} in {time.time() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
