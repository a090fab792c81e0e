#!/usr/bin/env python3
"""scripts/own_corpus.sh's run, checked: a JSONL corpus and a byte-level BPE tokenizer.json,
prepared as document chunks without masks, train a tiny MLM-only model whose loss falls.

  own_corpus_check.py REPO PACKBERT OUTDIR

Runs the script with 120 steps into OUTDIR and reads its metrics: the MLM loss starts near
ln(8192) = 9.01 (a uniform guess over the vocabulary) and the mean of the last three logged
losses must be at least 2.0 below the mean of the first three (measured: 8.44 -> 5.97). The
run is deterministic (fixed seeds, fixed corpus), so the margin is not a tolerance on noise.
The example needs the `tokenizers` package in this Python: without it, exit 2 (a failure).
"""
import json
import os
import subprocess
import sys

repo, binary, out = sys.argv[1:4]
py = sys.executable
try:
    import tokenizers  # noqa: F401
except ImportError as e:
    print(f"tokenizers is not importable by {py}: {e}", file=sys.stderr)
    sys.exit(2)
env = dict(os.environ, PACKBERT=binary, PYTHON=py, OUT=out)
r = subprocess.run(["bash", os.path.join(repo, "scripts", "own_corpus.sh"),
                    "--train.max_steps=120", "--optim.warmup_steps=12"],
                   env=env, capture_output=True, text=True)
print(r.stdout[-4000:], r.stderr[-4000:])
if r.returncode != 0:
    sys.exit(1)
train = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
train = [t for t in train if t.get("event") == "train"]
first = sum(t["mlm_loss"] for t in train[:3]) / 3
last = sum(t["mlm_loss"] for t in train[-3:]) / 3
print(f"mlm loss: first three {first:.3f}, last three {last:.3f}, steps {train[-1]['step']}")
ok = train[-1]["step"] == 120 and last < first - 2.0
print("ok" if ok else "FAILED: the loss did not fall by 2.0")
sys.exit(0 if ok else 1)
