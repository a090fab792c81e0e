#!/usr/bin/env bash
# docs/own_corpus.md's example, end to end on the CPU in about a minute:
#   0. make a JSONL corpus and a byte-level BPE tokenizer.json from the bundled corpus
#      (scripts/make_own_corpus_example.py; with your own files, skip this step);
#   1. prepare them into document-chunk shards without masks;
#   2. inspect the shards (what they record of their tokenizer);
#   3. train a tiny MLM-only model with dynamic masking (configs/own_corpus_tiny_cpu.toml)
#      and print the loss at the first and the last logged step.
# Extra arguments go to `packbert train` (e.g. --train.max_steps=100). OUT (default
# out/own_corpus, the config's paths) moves every output.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PACKBERT:-build/src/packbert}
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/own_corpus}
RANKS=${RANKS:-2}

rm -rf "$OUT"
"$PY" scripts/make_own_corpus_example.py data/kjv-bible-docs.txt.gz "$OUT"
"$BIN" prepare --input "$OUT/corpus.jsonl" --vocab "$OUT/tokenizer.json" \
  --samples documents --masks none --dupe-factor 1 --max-seq-len 256 --format varlength \
  --eval-samples 500 --output "$OUT/data"
"$BIN" inspect "$OUT/data/train"

threads=$(( $(nproc) / RANKS )); [ "$threads" -ge 1 ] || threads=1
MPI_FLAGS=(--oversubscribe -np "$RANKS" -x OMP_NUM_THREADS="$threads")
[ "$(id -u)" -eq 0 ] && MPI_FLAGS+=(--allow-run-as-root)
mpirun "${MPI_FLAGS[@]}" "$BIN" train --config configs/own_corpus_tiny_cpu.toml \
  --data.train_dir="$OUT/data/train" --data.eval_dir="$OUT/data/eval" \
  --data.vocab="$OUT/tokenizer.json" --checkpoint.dir="$OUT/checkpoints" \
  --log.metrics_file="$OUT/metrics.jsonl" "$@"

/usr/bin/python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
train = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "train"]
a, b = train[0], train[-1]
print(f"own corpus: mlm loss {a['mlm_loss']:.2f} at step {a['step']} -> {b['mlm_loss']:.2f} "
      f"at step {b['step']}; mlm accuracy {a['mlm_accuracy']:.3f} -> {b['mlm_accuracy']:.3f}")
PY
