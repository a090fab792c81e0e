#!/usr/bin/env bash
# The launch scripts stopped by a signal (label e2e), on a tiny 2-rank CPU run:
# - scripts/run_mlperf_8gpu.sh (NGPUS=2, a tiny model's CONFIG), stopped by SIGTERM to the script
#   and by SIGINT to its process group (Ctrl-C), exits 0, and its end.json names the checkpoint
#   of the last step; the same stop without a checkpoint directory exits 1;
# - a rank killed with SIGKILL: non-zero, and no end.json;
# - scripts/slurm_bert_large.sbatch, with srun replaced by a stand-in that runs its one task
#   itself and scontrol by one that records the call, exits 0 after SIGTERM to the batch script
#   and requeues the job.
# Plain mpirun exits 1 after it passed on a SIGTERM, so these statuses are the scripts' own
# (scripts/run_job.sh).
#
#   launch_signals.sh PACKBERT MPI_TRAIN_DRIVER VOCAB WORK_DIR
set -euo pipefail

packbert=$1 driver=$2 vocab=$3 work=$4
repo=$(cd "$(dirname "$0")/../.." && pwd)

rm -rf "$work"
mkdir -p "$work"
log=

job_pid=
cleanup() {
  # Whatever happened: no launcher or rank outlives the test, even one a broken script left
  # behind. The launched script leads a process group (set -m below); its launcher and each
  # rank lead their own, and every rank logs "packbert train: N rank(s), pid P" (killed only
  # while its command line still names this test's directory).
  if [[ -n $job_pid ]]; then kill -KILL -- "-$job_pid" 2>/dev/null || true; fi
  local p
  cat "$work"/*.log 2>/dev/null |
    sed -n 's/.*packbert train: [0-9]* rank(s), pid \([0-9]*\).*/\1/p' | while read -r p; do
      if ps -o args= -p "$p" 2>/dev/null | grep -qF "$work/"; then
        kill -KILL "$p" 2>/dev/null || true
      fi
    done
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  if [[ -n $log ]]; then
    echo "---- $log ----" >&2
    grep -v '\] \[info\]   ' "$log" >&2 || true
  fi
  exit 1
}

# A tiny model over random valid samples (lengths 5..64) that trains "forever".
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
EOF
# run_mlperf_8gpu.sh starts from a checkpoint (MLPerf's phase 1): one step's.
"$packbert" train --config "$work/config.toml" --train.max_steps=1 --checkpoint.dir="$work/init" \
  > "$work/init.log" 2>&1 || { log=$work/init.log; fail "the initial run failed"; }
init=$work/init/step_00000001

# start NAME COMMAND...: runs it in the background, in a process group of its own (as a shell
# runs a command in a terminal: SIGINT is not ignored there), output to $work/NAME.log.
start() {
  local name=$1; shift
  log=$work/$name.log
  set -m
  "$@" > "$log" 2>&1 &
  job_pid=$!
  set +m
}
# wait_step METRICS N: until rank 0 recorded step N (the job must still run).
wait_step() {
  local i
  for ((i = 0; i < 1200; ++i)); do
    grep -qE "\"step\":$2[,}]" "$1" 2>/dev/null && return 0
    kill -0 "$job_pid" 2>/dev/null || fail "the job ended before step $2"
    sleep 0.1
  done
  fail "no step $2 within 120 s"
}
# finish: sets rc to the job's exit status, once it ended (within 120 s).
rc=
finish() {
  local i
  for ((i = 0; i < 1200; ++i)); do
    if ! kill -0 "$job_pid" 2>/dev/null; then
      set +e
      wait "$job_pid"
      rc=$?
      set -e
      job_pid=
      return 0
    fi
    sleep 0.1
  done
  fail "still running 120 s after the signal"
}
field() { sed -n "s/.*\"$2\":\(\"\([^\"]*\)\"\|\([0-9a-z]*\)\).*/\2\3/p" "$1"; }
last_step() { grep -o '"step":[0-9]*' "$1" | tail -n 1 | cut -d: -f2; }

# mlperf NAME [--key=value ...]: run_mlperf_8gpu.sh with 2 ranks on the tiny config.
mlperf() {
  local name=$1; shift
  start "$name" env NGPUS=2 CONFIG="$work/config.toml" PACKBERT="$packbert" OUT="$work/$name" \
    OMP_NUM_THREADS=1 "$repo/scripts/run_mlperf_8gpu.sh" "$init" "$@"
}

# expect_clean_stop NAME END_FILE METRICS CKPT_DIR SIGNAL: exit status 0, and the end file
# names the stop signal the ranks got and the checkpoint of the last step recorded.
expect_clean_stop() {
  local name=$1 end=$2 metrics=$3 ckpt=$4 signal=$5 step want
  [[ $rc -eq 0 ]] || fail "$name: exit status $rc, not 0"
  [[ -f $end ]] || fail "$name: no $end"
  [[ $(field "$end" reason) == signal && $(field "$end" signal) == "$signal" ]] ||
    fail "$name: $end: $(cat "$end"), not a stop on signal $signal"
  step=$(last_step "$metrics")
  want=$(printf '%s/step_%08d' "$ckpt" "$step")
  [[ $(field "$end" checkpoint) == "$want" ]] || fail "$name: $end names not $want: $(cat "$end")"
  [[ -f $want/trainer_state.json ]] || fail "$name: $want is not a complete checkpoint"
  echo "$name: exit status 0, $(cat "$end")"
}
# Under mpirun the ranks must get SIGUSR1 (10) from run_job.sh, never mpirun's SIGTERM (15),
# which it follows with SIGKILL a second later: a tiny step and checkpoint fit in that second,
# a large one does not.
clean_mlperf_stop() {
  expect_clean_stop "$1" "$work/$1/end.json" "$work/$1/metrics.jsonl" "$work/$1/ckpt" 10
}

# 1. SIGTERM to the script.
mlperf term --checkpoint.dir="$work/term/ckpt"
wait_step "$work/term/metrics.jsonl" 2
kill -TERM "$job_pid"
finish
clean_mlperf_stop term

# 2. SIGINT to its process group, as Ctrl-C in a terminal sends it.
mlperf ctrl_c --checkpoint.dir="$work/ctrl_c/ckpt"
wait_step "$work/ctrl_c/metrics.jsonl" 2
kill -INT -- "-$job_pid"
finish
clean_mlperf_stop ctrl_c

# 3. The MLPerf config writes no checkpoint: the same stop leaves nothing to resume from.
mlperf no_ckpt --checkpoint.dir=
wait_step "$work/no_ckpt/metrics.jsonl" 2
kill -TERM "$job_pid"
finish
[[ $rc -eq 1 ]] || fail "no_ckpt: exit status $rc, not 1"
[[ $(field "$work/no_ckpt/end.json" checkpoint) == null ]] ||
  fail "no_ckpt: $(cat "$work/no_ckpt/end.json")"
echo "no_ckpt: exit status 1, $(cat "$work/no_ckpt/end.json")"

# 4. A rank dies: the job fails, and no end.json says otherwise.
mlperf rank_killed --checkpoint.dir="$work/rank_killed/ckpt"
wait_step "$work/rank_killed/metrics.jsonl" 2
rank1=$(sed -n 's/.*\[rank 1\].*packbert train: 2 rank(s), pid \([0-9]*\).*/\1/p' "$log" |
  head -n 1)
if [[ -z $rank1 ]] || ! ps -o comm= -p "$rank1" | grep -q packbert; then
  fail "no pid of rank 1"
fi
kill -KILL "$rank1"
finish
[[ $rc -ne 0 ]] || fail "rank_killed: exit status 0"
[[ ! -e $work/rank_killed/end.json ]] || fail "rank_killed: $(cat "$work/rank_killed/end.json")"
echo "rank_killed: exit status $rc, no end.json"

# 5. The Slurm script, run as Slurm runs it (from the submit directory), with stand-ins for srun
# (it runs its one task itself) and scontrol (the job is RUNNING; a requeue is recorded): SIGTERM
# to the batch script reaches the task through run_job.sh, and the stop with its checkpoint
# requeues the job (tests/slurm/test_sbatch.sh runs the script under a real Slurm).
mkdir -p "$work/fake_bin" "$work/slurm"
cat > "$work/fake_bin/srun" <<'EOF'
#!/usr/bin/env bash
while [[ ${1:-} == --* ]]; do shift; done  # srun's options
exec "$@"
EOF
cat > "$work/fake_bin/scontrol" <<EOF
#!/usr/bin/env bash
case "\$1 \${2:-}" in
  "show job") printf 'JobId=%s JobName=packbert-bert-large\n   JobState=RUNNING Reason=None\n   Requeue=1 Restarts=0\n' "\$3" ;;
  requeue*) echo "\$*" >> "$work/slurm/requeued" ;;
  *) exit 1 ;;
esac
EOF
chmod +x "$work/fake_bin/srun" "$work/fake_bin/scontrol"
start slurm env -C "$repo" PATH="$work/fake_bin:$PATH" SLURM_JOB_ID=4242 \
  SLURM_JOB_NAME=packbert-bert-large CKPT_DIR="$work/slurm/ckpt" OUT="$work/slurm/out" \
  PACKBERT="$packbert" OMP_NUM_THREADS=1 bash scripts/slurm_bert_large.sbatch "$work/config.toml"
wait_step "$work/slurm/out/metrics.jsonl" 2
kill -TERM "$job_pid"
finish
expect_clean_stop slurm "$work/slurm/out/end.json" "$work/slurm/out/metrics.jsonl" \
  "$work/slurm/ckpt" 15
[[ $(cat "$work/slurm/requeued" 2>/dev/null) == "requeue 4242" ]] ||
  fail "slurm: the job was not requeued (scontrol calls: $(cat "$work/slurm/requeued" 2>&1))"
echo "slurm: requeued"
echo "ok"
