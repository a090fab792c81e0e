#!/usr/bin/env bash
# The README demo, a few minutes on a 2-core machine:
#   1. prepare the bundled corpus (King James Bible, one document per chapter) into MLPerf-format
#      variable-length shards (configs/prepare_demo.toml) and validate them;
#   2. train a tiny BERT on the CPU with two MPI ranks (configs/demo_tiny_cpu.toml): the loss
#      falls from ~11 (ln 30528 for MLM + ln 2 for NSP) to ~6.3 and the MLM accuracy rises;
#   3. plot the metrics file to out/demo/metrics.png.
# TensorBoard event files go to out/demo/tensorboard as it trains (docs/tensorboard.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PACKBERT:-build/src/packbert}
OUT=out/demo  # the paths in configs/demo_tiny_cpu.toml
RANKS=${RANKS:-2}

rm -rf "$OUT"
"$BIN" prepare --config configs/prepare_demo.toml \
  --input data/kjv-bible-docs.txt.gz --output "$OUT/data"
"$BIN" inspect "$OUT/data/train" --vocab data/vocab.txt

# One rank per core pair; OpenMP threads share the rest.
threads=$(( $(nproc) / RANKS )); [ "$threads" -ge 1 ] || threads=1
MPI_FLAGS=(--oversubscribe -np "$RANKS" -x OMP_NUM_THREADS="$threads")
[ "$(id -u)" -eq 0 ] && MPI_FLAGS+=(--allow-run-as-root)
mpirun "${MPI_FLAGS[@]}" "$BIN" train --config configs/demo_tiny_cpu.toml \
  --log.tensorboard_dir="$OUT/tensorboard" "$@"

/usr/bin/python3 scripts/plot_metrics.py "$OUT/metrics.jsonl" "$OUT/metrics.png"
/usr/bin/python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in recs if r.get("event") == "train"]
evals = [r for r in recs if r.get("event") == "eval"]
a, b = train[0], train[-1]
print(f"demo: loss {a['loss']:.2f} (mlm {a['mlm_loss']:.2f}) at step {a['step']} -> "
      f"{b['loss']:.2f} (mlm {b['mlm_loss']:.2f}) at step {b['step']}; "
      f"mlm accuracy {a['mlm_accuracy']:.3f} -> {b['mlm_accuracy']:.3f}")
for e in evals:
    print(f"demo: eval at {e['samples']} samples: mlm accuracy {e['eval_accuracy']:.3f}, "
          f"mlm loss {e['eval_loss']:.2f}")
PY
echo "demo: plot written to $OUT/metrics.png, checkpoints in $OUT/checkpoints," \
  "TensorBoard logdir $OUT/tensorboard"
