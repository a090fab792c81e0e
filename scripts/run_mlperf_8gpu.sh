#!/usr/bin/env bash
# MLPerf-style BERT-Large phase-2 run on one node with 8 GPUs: one rank per GPU, each rank bound
# to its GPU and to the CPU cores and memory of that GPU's NUMA node.
#
#   scripts/run_mlperf_8gpu.sh PHASE1_CHECKPOINT [--section.key=value ...]
#
# Environment: NGPUS (default 8), CONFIG (default configs/bert_large_phase2_mlperf.toml),
# PACKBERT (default build/src/packbert), SEED (default: random, logged; MLPerf wants a new seed
# per run), OUT (default out/mlperf/run-<date>: metrics, MLPerf log, end.json).
# Data: data.train_dir / data.eval_dir of the config (docs/mlperf.md).
#
# SIGTERM or SIGINT to this script stops the run after the step in flight (scripts/run_job.sh
# passes it on to every rank). Exit status 0 when the run finished, or stopped on the signal
# with a checkpoint written (the MLPerf config writes none: give --checkpoint.dir=DIR to have
# one); non-zero otherwise. $OUT/end.json says how it ended.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 PHASE1_CHECKPOINT [--section.key=value ...]" >&2; exit 2; }
INIT=$1; shift
NGPUS=${NGPUS:-8}
CONFIG=${CONFIG:-configs/bert_large_phase2_mlperf.toml}
BIN=${PACKBERT:-build/src/packbert}
SEED=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
OUT=${OUT:-out/mlperf/run-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

# The per-rank wrapper: mpirun sets OMPI_COMM_WORLD_LOCAL_RANK; the rank sees only its GPU and
# runs on the cores of its NUMA node (numactl when present).
WRAP="$OUT/bind_rank.sh"
cat > "$WRAP" <<'SH'
#!/usr/bin/env bash
lr=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}
export CUDA_VISIBLE_DEVICES=$lr
# nvidia-smi's bus id is 00000000:07:00.0; sysfs names the device 0000:07:00.0.
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "$lr" 2>/dev/null | tr 'A-F' 'a-f')
node=$(cat "/sys/bus/pci/devices/${bus#0000}/numa_node" 2>/dev/null || echo -1)
if command -v numactl >/dev/null && [ "${node:--1}" -ge 0 ]; then
  exec numactl --cpunodebind="$node" --membind="$node" "$@"
fi
exec "$@"
SH
chmod +x "$WRAP"

ROOT_FLAG=(); [ "$(id -u)" -eq 0 ] && ROOT_FLAG=(--allow-run-as-root)
echo "run_mlperf_8gpu: $NGPUS ranks, seed $SEED, init $INIT, output $OUT"
echo "run_mlperf_8gpu: afterwards, check the MLPerf log with"
echo "  python3 -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 $OUT/mllog.txt"
# exec: this script's pid becomes run_job.sh's, so a signal sent to it reaches the job.
exec scripts/run_job.sh --forward USR1 "$OUT/end.json" \
  mpirun "${ROOT_FLAG[@]}" -np "$NGPUS" --bind-to none \
  -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" -x NCCL_DEBUG="${NCCL_DEBUG:-WARN}" \
  "$WRAP" "$BIN" train --config "$CONFIG" --init-checkpoint "$INIT" \
  --train.seed="$SEED" --log.metrics_file="$OUT/metrics.jsonl" \
  --log.mllog_file="$OUT/mllog.txt" --log.end_file="$OUT/end.json" "$@"
