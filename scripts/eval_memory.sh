#!/usr/bin/env bash
# Memory of evaluation, for one or more packbert binaries side by side (CPU, fp32):
#
#   scripts/eval_memory.sh [BIN ...]        (default: build/src/packbert)
#
# Prints a markdown table with, per binary:
#   - the peak RSS of `packbert eval` on a BERT-base checkpoint (seq 128, 128 samples in eval batches of 64), and
#     of one BERT-base training step of global batch 32 at the same size, for comparison;
#   - the demo model's training activation peak (metrics activation_peak_bytes) at the logged
#     step before an evaluation and at the one after it, and the arena's allocation count.
# The demo data (scripts/demo.sh's prepare) is made under out/eval_memory/ when missing, and the
# BERT-base checkpoint by one training step of the first binary (the others read the same one).
# Peak RSS is GNU time's "Maximum resident set size".
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- build/src/packbert
OUT=out/eval_memory
DATA=$OUT/data
mkdir -p "$OUT"
first=$1
if [ ! -d "$DATA/eval" ]; then
  "$first" prepare --config configs/prepare_demo.toml --input data/kjv-bible-docs.txt.gz \
    --output "$DATA" > "$OUT/prepare.log" 2>&1
fi

# BERT-base on the CPU, small batches: what is measured is memory, not speed.
BASE=(--config configs/bert_base_seq128.toml --train.device=cpu --train.precision=fp32
      --data.train_dir="$DATA/train" --data.eval_dir="$DATA/eval" --data.vocab=data/vocab.txt
      --train.global_batch_size=32 --train.gradient_accumulation_steps=1
      '--checkpoint.resume=""' --checkpoint.every_steps=0 --eval.batch_size=64 --eval.max_samples=128
      '--log.metrics_file=""' --train.collective_timeout_s=0)
CKPT=$OUT/base_ckpt
if [ ! -f "$CKPT/step_00000001/model.safetensors" ]; then
  rm -rf "$CKPT"
  "$first" train "${BASE[@]}" --train.max_steps=1 --checkpoint.dir="$CKPT" \
    --eval.at_end=false > "$OUT/base_train.log" 2>&1
fi

peak_rss_mb() {  # command... -> MB
  /usr/bin/time -v "$@" > "$OUT/last.log" 2>&1 || { cat "$OUT/last.log" >&2; return 1; }
  awk '/Maximum resident set size/ {printf "%.0f", $NF / 1024}' "$OUT/last.log"
}

echo "| binary | eval peak RSS MB (BERT-base) | train step peak RSS MB (BERT-base) |" \
     "demo act before eval MB | demo act after eval MB | demo arena allocations |"
echo "|---|---|---|---|---|---|"
for bin in "$@"; do
  eval_mb=$(peak_rss_mb "$bin" eval "${BASE[@]}" '--checkpoint.dir=""' \
              --checkpoint "$CKPT/step_00000001")
  train_mb=$(peak_rss_mb "$bin" train "${BASE[@]}" --train.max_steps=1 '--checkpoint.dir=""' \
               --eval.at_end=false)
  # The demo model: an evaluation after step 10, progress records every 5 steps.
  metrics=$OUT/demo_metrics.jsonl
  rm -f "$metrics"
  "$bin" train --config configs/demo_tiny_cpu.toml --data.train_dir="$DATA/train" \
    --data.eval_dir="$DATA/eval" --train.max_steps=15 --eval.every_samples=320 \
    --eval.at_end=false --log.every_steps=5 --log.metrics_file="$metrics" \
    '--checkpoint.dir=""' --checkpoint.every_steps=0 > "$OUT/demo.log" 2>&1
  read -r before after allocs < <(python3 - "$metrics" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = {r["step"]: r for r in recs if r.get("event") == "train"}
mb = lambda r: r["activation_peak_bytes"] / 2**20
print(f"{mb(train[10]):.1f} {mb(train[15]):.1f} {train[15].get('arena_allocations', 'n/a')}")
PY
)
  echo "| $bin | $eval_mb | $train_mb | $before | $after | $allocs |"
done
