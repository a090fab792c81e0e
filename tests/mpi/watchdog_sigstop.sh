#!/usr/bin/env bash
# The collective watchdog through the binary (label mpi): a 2-rank `packbert train` with
# train.collective_timeout_s = 5 (or --timeout S) runs until step 2, then one rank is stopped with SIGSTOP (as a
# rank stuck in I/O or a driver call). The other rank's watchdog must end the whole job: mpirun
# exits non-zero within the timeout + 30 s, and the log holds the watchdog's line naming the
# collective and the step, from the rank that was not stopped.
#
#   watchdog_sigstop.sh PACKBERT MPI_TRAIN_DRIVER VOCAB WORK_DIR STOP_RANK MPIEXEC [--need TEXT]
#                       [--timeout S] [--section.key=VALUE ...]
#
# The config overrides go to `packbert train` (e.g. --train.device=cuda: the emulated build's
# NCCL run, tests/emulation/CMakeLists.txt); --need TEXT: the watchdog's line must contain TEXT
# (e.g. "NCCL all-reduce": the watchdog saw the NCCL round, not a host collective). --timeout:
# longer than a step can take, whatever the load (an emulated GPU step takes seconds, and a rank
# may lag its peer by one).
set -euo pipefail

packbert=$1 driver=$2 vocab=$3 work=$4 stop_rank=$5 mpiexec=$6
shift 6
need=
timeout_s=5
overrides=()
while (($#)); do
  case $1 in
    --need) need=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    *) overrides+=("$1"); shift ;;
  esac
done
limit_ms=$(((timeout_s + 30) * 1000))
now_ms() { echo $(($(date +%s%N) / 1000000)); }

rm -rf "$work"
mkdir -p "$work"
log=$work/log.txt
metrics=$work/metrics.jsonl

mpirun_pid=
rank_pid=
cleanup() {
  # Whatever happened: no stopped or orphaned process outlives the test.
  if [[ -n $rank_pid ]] && kill -0 "$rank_pid" 2>/dev/null; then
    kill -CONT "$rank_pid" 2>/dev/null || true
    kill -KILL "$rank_pid" 2>/dev/null || true
  fi
  if [[ -n $mpirun_pid ]] && kill -0 "$mpirun_pid" 2>/dev/null; then
    kill -KILL "$mpirun_pid" 2>/dev/null || true
  fi
  for p in $(grep -o 'rank(s), pid [0-9]*' "$log" 2>/dev/null | grep -o '[0-9]*$'); do
    if ps -o comm= -p "$p" 2>/dev/null | grep -q packbert; then
      kill -CONT "$p" 2>/dev/null || true
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  echo "---- log ----" >&2
  cat "$log" >&2 || true
  exit 1
}

# A small data set of random valid samples (lengths 5..64) and a tiny model that trains "forever".
"$driver" write "$work/shards" --shards 2 --rows 200 > /dev/null
cat > "$work/config.toml" <<EOF
[model]
preset = "tiny"
[train]
max_steps = 100000
global_batch_size = 8
seed = 7
max_seq_len = 64
max_predictions_per_seq = 12
collective_timeout_s = $timeout_s
[optim]
lr = 1e-3
warmup_steps = 2
[data]
train_dir = "$work/shards"
vocab = "$vocab"
shuffle_block_rows = 16
shuffle_window_blocks = 2
[eval]
every_samples = 0
at_end = false
[log]
every_steps = 1
metrics_file = "$metrics"
EOF

"$mpiexec" --allow-run-as-root --oversubscribe --mca btl self,vader -x OMP_NUM_THREADS=1 \
  -x OPENBLAS_NUM_THREADS=1 -np 2 "$packbert" train --config "$work/config.toml" \
  "${overrides[@]}" > "$log" 2>&1 &
mpirun_pid=$!

# Training has started when rank 0 wrote the record of step 2.
started() { grep -qE '"step":([2-9]|[0-9]{2,})[,}]' "$metrics" 2>/dev/null; }
for ((i = 0; i < 900; ++i)); do
  started && break
  kill -0 "$mpirun_pid" 2>/dev/null || fail "the job ended before step 2"
  sleep 0.1
done
started || fail "no step 2 within 90 s"

# Every rank logs "[rank R] ... packbert train: N rank(s), pid P".
rank_pid=$(sed -n "s/.*\[rank $stop_rank\].*packbert train: 2 rank(s), pid \([0-9]*\).*/\1/p" \
  "$log" | head -n 1)
[[ -n $rank_pid ]] || fail "no pid of rank $stop_rank in the log"
ps -o comm= -p "$rank_pid" | grep -q packbert || fail "pid $rank_pid is not a packbert process"

kill -STOP "$rank_pid"
t0=$(now_ms)
echo "rank $stop_rank (pid $rank_pid) stopped after step $(grep -c '"event":"train"' "$metrics")"

rc=
while :; do
  if ! kill -0 "$mpirun_pid" 2>/dev/null; then
    set +e
    wait "$mpirun_pid"
    rc=$?
    set -e
    break
  fi
  (($(now_ms) - t0 <= limit_ms)) ||
    fail "the job still runs $((limit_ms / 1000)) s after rank $stop_rank was stopped"
  sleep 0.1
done
elapsed_ms=$(($(now_ms) - t0))
mpirun_pid=
echo "mpirun exited $rc, $((elapsed_ms / 1000)).$((elapsed_ms % 1000 / 100)) s after SIGSTOP" \
  "of rank $stop_rank (timeout $timeout_s s)"

[[ $rc -ne 0 ]] || fail "mpirun exited 0"
# A host collective's line ("has waited T s in WHAT at step S") or an asynchronous one's (an
# NCCL round: "WHAT at step S has not completed after T s").
host='has waited [0-9.]+ s in .+ at step [0-9]+'
async=': .+ at step [0-9]+.* has not completed after [0-9.]+ s'
line=$(grep -E "collective watchdog: rank [0-9]+( $host|$async)" "$log" | head -n 1) ||
  fail "no watchdog message"
echo "$line"
other=$((1 - stop_rank))
[[ $line == *"[rank $other]"*"collective watchdog: rank $other"[\ :]* ]] ||
  fail "the watchdog message is not from rank $other"
[[ -z $need || $line == *"$need"* ]] || fail "the watchdog message does not say '$need'"
echo "ok"
