#!/usr/bin/env bash
# The README demo: prepare the bundled corpus (King James Bible, one document per chapter)
# into MLPerf-format shards with configs/prepare_demo.toml, then validate and summarise them.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PACKBERT:-build/src/packbert}
OUT=${DEMO_DIR:-out/demo}

rm -rf "$OUT/data"
"$BIN" --config configs/prepare_demo.toml prepare \
  --input data/kjv-bible-docs.txt.gz --output "$OUT/data"
"$BIN" inspect "$OUT/data/train" --vocab data/vocab.txt
"$BIN" inspect "$OUT/data/eval" --vocab data/vocab.txt
