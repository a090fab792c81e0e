#!/usr/bin/env python3
"""The MLM loss of a ModernBertForMaskedLM checkpoint on a fixed batch: the reference packbert's
ModernBERT options are held to.

    modernbert_reference.py HF_DIR BATCH_JSON [--logits OUT.f32]

HF_DIR: what ModernBertForMaskedLM.from_pretrained loads (e.g. scripts/convert_hf_checkpoint.py
--to modernbert's output). BATCH_JSON: the batch format of tests/e2e/hf_roundtrip_tool.cpp,
{"samples": [{"input_ids": [...], "masked_positions": [...], "masked_labels": [...], ...}]}
(other fields are ignored: ModernBERT has no token types or NSP head).

The model runs in fp32, in eval mode (no dropout), with attn_implementation="eager": the
reference semantics (the SDPA and flash paths compute the same thing, less exactly). The
samples are padded on the right to the longest, with an attention mask; every sample's
positions are 0, 1, ... as packbert's are (ModernBertModel's eager path uses arange(seq_len)).

Prints one JSON line: mlm_loss (the mean cross entropy over the masked tokens, computed here
from the logits), hf_loss (the same by transformers' own loss, as a cross-check), masked_tokens,
vocab_size, and a checksum of the logits at the masked positions over the whole (padded)
vocabulary: logits_sum and logits_abs_sum, float64 sums. --logits writes those logits, raw
little-endian f32 [masked tokens, vocab], in the batch's order (sample by sample, positions as
listed).

Needs torch and transformers >= 4.48 (ModernBERT); over torch < 2.1 the shims of torch_shims.py
(imported first).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_shims  # noqa: E402,F401  (before transformers' ModernBERT)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import ModernBertForMaskedLM  # noqa: E402


def load_model(hf_dir):
    model = ModernBertForMaskedLM.from_pretrained(hf_dir, attn_implementation="eager",
                                                  torch_dtype=torch.float32)
    model.eval()
    return model


def mlm_reference(model, samples):
    """(mean masked-token loss, transformers' loss, logits [masked, V] at the masked positions)."""
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    n, length = len(samples), max(len(s["input_ids"]) for s in samples)
    ids = torch.full((n, length), pad, dtype=torch.long)
    mask = torch.zeros(n, length, dtype=torch.long)
    labels = torch.full((n, length), -100, dtype=torch.long)
    rows, cols, targets = [], [], []
    for i, s in enumerate(samples):
        k = len(s["input_ids"])
        ids[i, :k] = torch.tensor(s["input_ids"])
        mask[i, :k] = 1
        for p, label in zip(s["masked_positions"], s["masked_labels"]):
            labels[i, p] = label
            rows.append(i)
            cols.append(p)
            targets.append(label)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        logits = out.logits[torch.tensor(rows), torch.tensor(cols)]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets))
    return float(loss), float(out.loss), logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("batch_json")
    ap.add_argument("--logits", help="write the masked positions' logits here (f32)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    with open(args.batch_json) as f:
        samples = json.load(f)["samples"]
    model = load_model(args.hf_dir)
    loss, hf_loss, logits = mlm_reference(model, samples)
    z = logits.double()
    print(json.dumps({"mlm_loss": loss, "hf_loss": hf_loss, "masked_tokens": int(z.shape[0]),
                      "vocab_size": int(z.shape[1]), "logits_sum": float(z.sum()),
                      "logits_abs_sum": float(z.abs().sum())}))
    if args.logits:
        logits.numpy().astype(np.float32).tofile(args.logits)


if __name__ == "__main__":
    main()
