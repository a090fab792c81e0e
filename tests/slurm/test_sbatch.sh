#!/usr/bin/env bash
# scripts/slurm_bert_large.sbatch under a real Slurm (label slurm): a one-node cluster of its own
# (tests/slurm/mini_slurm.sh: munged, slurmctld, slurmd from Debian's packages, pmix, KillWait=30)
# runs the script on a tiny CPU model with --gpus-per-node=0 and checks:
#   1. a run to the end, preempted on the way: `scancel --signal=TERM` stops it with a checkpoint,
#      the job requeues itself, resumes at the next step, finishes COMPLETED; the log keeps the
#      lines of both starts (--open-mode=append); each task is bound to its own one CPU;
#   2. kill -9 of one rank ends the job within 10 s (KillWait stays 30), FAILED, not requeued,
#      the other rank naming the collective it waited in;
#   3. a task of --cpus-per-task=2 may run on 2 CPUs, with OMP_NUM_THREADS=2; a plain `scancel`
#      stops it with a checkpoint and the job stays CANCELLED (not requeued);
#   4. --init-checkpoint beside a checkpoint of another run in CKPT_DIR: the job fails before
#      training with a message naming both;
#   5. submitted from directories outside the repository, without --chdir (the job runs there)
#      by an absolute path that holds a space, and with --chdir by a relative path (../..):
#      the script finds the repository (scontrol's Command=), the config and OUT are taken
#      relative to the job's directory, the run finishes COMPLETED;
#   6. a copy of the script outside the repository fails naming what it tried and PACKBERT_HOME;
#      a PACKBERT_HOME without scripts/run_job.sh fails naming it.
# It prints the times it measured (submit to running, SIGTERM to checkpoint, requeue to resume,
# kill of a rank to the job's end) and stops its daemons whatever happens. Exit status 77 (ctest:
# skipped) with "skipped: <reason>" without Slurm's packages or without root.
#
#   test_sbatch.sh PACKBERT MPI_TRAIN_DRIVER VOCAB WORK_DIR
set -euo pipefail

packbert=$1 driver=$2 vocab=$3 work=$4
# Absolute: the jobs of case 5 run outside the directory this runs in.
packbert=$(cd "$(dirname "$packbert")" && pwd)/$(basename "$packbert")
vocab=$(cd "$(dirname "$vocab")" && pwd)/$(basename "$vocab")
repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/tests/slurm

for tool in slurmctld slurmd munged sbatch srun scontrol squeue; do
  if ! command -v "$tool" > /dev/null; then
    echo "skipped: $tool is not installed (scripts/install_deps.sh --tests installs Slurm and munge)"
    exit 77
  fi
done
if [[ $(id -u) -ne 0 ]]; then
  echo "skipped: slurmd must run as root to start the tasks, and this runs as $(id -un)"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
# The cases find the repository from the script's path (5 and 6 check how).
unset PACKBERT_HOME
work=$(cd "$work" && pwd)
cluster=$work/cluster
t_start=$(date +%s.%N)

cleanup() {
  # Jobs first (their tasks end with them), then the daemons, then anything of this test's that
  # survived them (its command line names this test's directory).
  if [[ -n ${SLURM_CONF:-} ]]; then scancel --full --quiet --user=root 2>/dev/null || true; fi
  sleep 1
  "$here/mini_slurm.sh" stop "$cluster" || true
  local p
  for p in $(pgrep -f "$work/" || true); do
    if [[ $p -ne $$ ]]; then kill -KILL "$p" 2>/dev/null || true; fi
  done
}
trap cleanup EXIT

log=
fail() {
  echo "FAIL: $*" >&2
  if [[ -n $log && -f $log ]]; then
    echo "---- $log ----" >&2
    grep -v '\] \[info\]   \|\] \[info\] step ' "$log" >&2 || true
  fi
  echo "---- slurmctld / slurmd log (last lines) ----" >&2
  tail -n 15 "$cluster/log/slurmctld.log" "$cluster/log/slurmd.log" >&2 2>/dev/null || true
  exit 1
}

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# job_field JOB KEY: KEY=VALUE of `scontrol show job`
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
# wait_state JOB STATE SECONDS: until the job is in STATE; fails at once on another final state.
wait_state() {
  local i state
  for ((i = 0; i < $3 * 10; ++i)); do
    state=$(job_field "$1" JobState)
    [[ $state == "$2" ]] && return 0
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | OUT_OF_MEMORY | NODE_FAIL | BOOT_FAIL | DEADLINE)
        fail "job $1 is $state, not $2 (reason: $(job_field "$1" Reason))" ;;
    esac
    sleep 0.1
  done
  fail "job $1 not $2 within $3 s (state: $(job_field "$1" JobState), reason: $(job_field "$1" Reason))"
}
# wait_line FILE PATTERN SECONDS: until FILE has a line matching PATTERN (grep -E).
wait_line() {
  local i
  for ((i = 0; i < $3 * 10; ++i)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no line '$2' in $1 within $3 s"
}
# pids_of_ranks LOG N: the pids of ranks 0..N-1 of the last start the log shows.
pids_of_ranks() {
  local r
  for ((r = 0; r < $2; ++r)); do
    sed -n "s/.*\[rank $r\].*packbert train: $2 rank(s), pid \([0-9]*\).*/\1/p" "$1" | tail -n 1
  done
}
cpu_count() {  # a Cpus_allowed_list such as 0-3,6 -> 5
  tr ',' '\n' <<< "$1" | awk -F- '{ n += (NF == 2 ? $2 - $1 + 1 : 1) } END { print n }'
}
field() { sed -n "s/.*\"$2\":\(\"\([^\"]*\)\"\|\([0-9a-z]*\)\).*/\2\3/p" "$1"; }
# submit NAME [SBATCH OPTION...] -- [TRAIN ARG...]: the script on the tiny config, from the
# repository root, its log in $work/NAME.out, its run directory $work/NAME/out; prints the job id.
submit() {
  local name=$1; shift
  local opts=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  mkdir -p "$work/$name"
  CKPT_DIR=${CKPT_DIR:-$work/$name/ckpt} OUT=$work/$name/out PACKBERT=$packbert \
    sbatch --parsable --chdir="$repo" --output="$work/$name.out" --job-name="packbert-$name" \
    --gpus-per-node=0 "${opts[@]}" scripts/slurm_bert_large.sbatch "$work/config.toml" "$@"
}

# The data and the tiny model's config: random valid samples (lengths 5..64).
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

# The cluster. A requeued job waits cred_expire before it may start again: 10 s here (Slurm's
# default is 120 s, which would double this test's time).
MINI_SLURM_CRED_EXPIRE=10 "$here/mini_slurm.sh" start "$cluster" || fail "the cluster did not start"
export SLURM_CONF=$cluster/slurm.conf
killwait=$(scontrol show config | sed -n 's/^KillWait *= *\([0-9]*\) sec.*/\1/p')
[[ $killwait == 30 ]] || fail "KillWait is '$killwait', not 30"
ncpus=$(sinfo -h -o %c)
[[ $ncpus -ge 2 ]] || { echo "skipped: the node has $ncpus CPU(s); the test needs 2"; exit 77; }
echo "cluster up in $(secs "$t_start" "$(now)") s: $(sinfo -h -o '%N %c CPUs %T'), KillWait $killwait s"

# 1. Preempted, requeued, resumed, finished. 2 tasks of 1 CPU.
name=chain log=$work/$name.out
steps=60
t_submit=$(now)
job=$(submit "$name" --ntasks-per-node=2 --cpus-per-task=1 -- --train.max_steps=$steps)
wait_state "$job" RUNNING 60
t_running=$(now)
metrics=$work/$name/out/metrics.jsonl
wait_line "$metrics" '"step":1[,}]' 60
t_first_step=$(now)
wait_line "$metrics" '"step":3[,}]' 60
mapfile -t pids < <(pids_of_ranks "$log" 2)
cpus=()
for p in "${pids[@]}"; do
  c=$(sed -n 's/^Cpus_allowed_list:\s*//p' "/proc/$p/status" 2>/dev/null) || true
  [[ -n $c ]] || fail "no CPU list of task pid $p"
  [[ $(cpu_count "$c") -eq 1 ]] || fail "a task of --cpus-per-task=1 may run on CPUs $c"
  cpus+=("$c")
done
[[ ${cpus[0]} != "${cpus[1]}" ]] || fail "both tasks are bound to CPU ${cpus[0]}"
t_term=$(now)
scancel --signal=TERM "$job"
wait_line "$log" 'run_job: stopped by signal 15 after step' 60
t_checkpoint=$(now)
stopped_at=$(sed -n 's/.*run_job: stopped by signal 15 after step \([0-9]*\),.*/\1/p' "$log" | tail -n 1)
[[ -d $work/$name/ckpt/$(printf 'step_%08d' "$stopped_at") ]] || fail "no checkpoint of step $stopped_at"
[[ $stopped_at -lt $steps ]] || fail "the run ended before the signal (step $stopped_at)"
wait_line "$log" "slurm_bert_large: requeueing job $job" 30
for ((i = 0; i < 300; ++i)); do
  [[ $(job_field "$job" Restarts) == 1 && $(job_field "$job" JobState) == PENDING ]] && break
  sleep 0.1
done
[[ $(job_field "$job" Restarts) == 1 ]] || fail "job $job was not requeued (Restarts=$(job_field "$job" Restarts))"
t_requeued=$(now)
held=$(( $(date -d "$(job_field "$job" EligibleTime)" +%s) - $(date -d "$(job_field "$job" SubmitTime)" +%s) ))
wait_state "$job" RUNNING 120
t_rerunning=$(now)
wait_line "$metrics" "\"step\":$((stopped_at + 1))[,}]" 60
t_resumed=$(now)
wait_state "$job" COMPLETED 120
grep -q "loaded from $work/$name/ckpt/$(printf 'step_%08d' "$stopped_at")" "$log" ||
  fail "the requeued job did not resume from step $stopped_at"
# Every step once, in order, across the two starts.
got=$(grep -o '"step":[0-9]*' "$metrics" | cut -d: -f2 | tr '\n' ' ')
[[ $got == "$(seq -s ' ' 1 $steps) " ]] || fail "steps recorded: $got"
[[ $(field "$work/$name/out/end.json" reason) == finished ]] || fail "end.json: $(cat "$work/$name/out/end.json")"
[[ $(grep -c 'slurm_bert_large: job .*, start' "$log") -eq 2 ]] ||
  fail "the log does not hold both starts (--open-mode=append)"
[[ $(job_field "$job" ExitCode) == 0:0 && $(job_field "$job" Restarts) == 1 ]] ||
  fail "job $job: exit code $(job_field "$job" ExitCode), restarts $(job_field "$job" Restarts)"
echo "1. chain: tasks on CPUs ${cpus[*]}; SIGTERM (at step 3 or later) stopped it after step" \
  "$stopped_at with its checkpoint, requeued, resumed at step $((stopped_at + 1)), finished" \
  "step $steps: COMPLETED, Restarts=1"

# 2. A rank killed: the job ends in seconds, not at KillWait.
name=killed log=$work/$name.out
job=$(submit "$name" --ntasks-per-node=2 --cpus-per-task=1 --)
wait_line "$work/$name/out/metrics.jsonl" '"step":2[,}]' 120
mapfile -t pids < <(pids_of_ranks "$log" 2)
t_kill=$(now)
kill -KILL "${pids[1]}"
for ((i = 0; i < 600; ++i)); do
  state=$(job_field "$job" JobState)
  [[ $state != RUNNING && $state != COMPLETING ]] && break
  sleep 0.05
done
t_killed_end=$(now)
kill_s=$(secs "$t_kill" "$t_killed_end")
[[ $state == FAILED ]] || fail "job $job is $state after a rank was killed, not FAILED"
awk -v s="$kill_s" 'BEGIN { exit !(s < 10) }' || fail "the job ended $kill_s s after the kill, not within 10 s"
grep -q "\[rank 0\] \[error\] collective watchdog: rank 0 received signal 15 " "$log" ||
  fail "rank 0 did not report the stop it could not honour"
[[ $(job_field "$job" Restarts) == 0 ]] || fail "job $job was requeued"
echo "2. killed: kill -9 of rank 1 ended the job in $kill_s s (KillWait $killwait s): FAILED," \
  "$(job_field "$job" ExitCode)"

# 3. One task of 2 CPUs; a plain scancel does not requeue.
name=cpus2 log=$work/$name.out
job=$(submit "$name" --ntasks-per-node=1 --cpus-per-task=2 --)
wait_line "$work/$name/out/metrics.jsonl" '"step":1[,}]' 120
pid=$(pids_of_ranks "$log" 1)
c=$(sed -n 's/^Cpus_allowed_list:\s*//p' "/proc/$pid/status")
[[ $(cpu_count "$c") -eq 2 ]] || fail "the task of --cpus-per-task=2 may run on CPUs $c"
omp=$(tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^OMP_NUM_THREADS=//p')
[[ $omp == 2 ]] || fail "OMP_NUM_THREADS=$omp in the task, not 2"
scancel "$job"
wait_line "$log" "slurm_bert_large: job $job is [A-Z]*: not requeued" 60
wait_state "$job" CANCELLED 60
sleep 1
[[ $(job_field "$job" JobState) == CANCELLED && $(job_field "$job" Restarts) == 0 ]] ||
  fail "job $job: $(job_field "$job" JobState), restarts $(job_field "$job" Restarts)"
echo "3. cpus2: the task may run on CPUs $c, OMP_NUM_THREADS=$omp; scancel: CANCELLED, not requeued"

# 4. --init-checkpoint beside another run's checkpoint: never silent.
name=init log=$work/$name.out
init=$work/chain/ckpt/$(printf 'step_%08d' "$stopped_at")
job=$(CKPT_DIR=$work/chain/ckpt submit "$name" --ntasks-per-node=1 --cpus-per-task=1 -- \
  --init-checkpoint "$init")
wait_state "$job" FAILED 120
grep -q -- "--init-checkpoint $init and a checkpoint to resume, $work/chain/ckpt/step_$(printf '%08d' $steps)" "$log" ||
  fail "no error naming both checkpoints"
grep -q "To continue that run, drop --init-checkpoint" "$log" || fail "the error does not say how to choose"
if grep -q "\] step 1/" "$log"; then fail "it trained"; fi
echo "4. init: --init-checkpoint beside $work/chain/ckpt: FAILED before training, naming both"

# 5. Submitted from outside the repository: a run directory of its own, where the job runs (no
# --chdir), the script named through a path with a space (a link to the repository); and from
# another directory with --chdir, the script named relative to where sbatch runs (Command= keeps
# ../x as given). Both at once (1 CPU each), 4 steps, the config and OUT relative to the job's
# directory, checkpoints in the job's directory.
ln -s "$repo" "$work/a repo"
mkdir -p "$work/abs/run" "$work/rel/submit" "$work/rel/deeper/run"
job_abs=$(cd "$work/abs/run" && CKPT_DIR=ckpt OUT=out PACKBERT=$packbert \
  sbatch --parsable --output="$work/abs.out" --job-name=packbert-abs --gpus-per-node=0 \
  --ntasks-per-node=1 --cpus-per-task=1 "$work/a repo/scripts/slurm_bert_large.sbatch" \
  ../../config.toml --train.max_steps=4)
rel=$(realpath --relative-to="$work/rel/submit" "$repo")
job_rel=$(cd "$work/rel/submit" && CKPT_DIR=ckpt OUT=out PACKBERT=$packbert \
  sbatch --parsable --chdir="$work/rel/deeper/run" --output="$work/rel.out" \
  --job-name=packbert-rel --gpus-per-node=0 --ntasks-per-node=1 --cpus-per-task=1 \
  "$rel/scripts/slurm_bert_large.sbatch" ../../../config.toml --train.max_steps=4)
# check_elsewhere NAME JOB DIR REPO: JOB ran in DIR, found REPO, finished.
check_elsewhere() {
  local name=$1 job=$2 dir=$3 home=$4 cmdline
  log=$work/$name.out
  wait_state "$job" COMPLETED 120
  cmdline=$(scontrol show job "$job" | sed -n 's/^ *Command=//p')
  [[ $(field "$dir/out/end.json" reason) == finished ]] || fail "$name: end.json: $(cat "$dir/out/end.json")"
  [[ -d $dir/ckpt/step_00000004 ]] || fail "$name: no checkpoint of step 4 in $dir/ckpt"
  grep -qF "output out, repository $home" "$log" || fail "$name: the log names no repository $home"
  echo "5. $name: Command=$cmdline; the job in $dir found $home: COMPLETED, end.json finished"
}
check_elsewhere abs "$job_abs" "$work/abs/run" "$work/a repo"
check_elsewhere rel "$job_rel" "$work/rel/deeper/run" "$repo"

# 6. No repository: a copy of the script elsewhere; a PACKBERT_HOME without scripts/run_job.sh.
mkdir -p "$work/lone"
cp "$repo/scripts/slurm_bert_large.sbatch" "$work/lone/"
job_lone=$(cd "$work/lone" && PACKBERT=$packbert sbatch --parsable --output="$work/lone.out" \
  --gpus-per-node=0 --ntasks-per-node=1 --cpus-per-task=1 slurm_bert_large.sbatch ../config.toml)
job_home=$(cd "$work/lone" && PACKBERT_HOME=$work PACKBERT=$packbert sbatch --parsable \
  --output="$work/home.out" --gpus-per-node=0 --ntasks-per-node=1 --cpus-per-task=1 \
  "$repo/scripts/slurm_bert_large.sbatch" ../config.toml)
log=$work/lone.out
wait_state "$job_lone" FAILED 60
want="cannot find the repository (a directory holding scripts/run_job.sh); tried: PACKBERT_HOME"
want+=" (not set); the submitted script's path $work/lone/slurm_bert_large.sbatch (scontrol show"
want+=" job: Command=); the script's own path"
grep -qF "$want" "$log" || fail "lone: no error naming what it tried"
grep -qF "Set PACKBERT_HOME to the repository" "$log" || fail "lone: the error does not name PACKBERT_HOME"
log=$work/home.out
wait_state "$job_home" FAILED 60
grep -qF "PACKBERT_HOME=$work holds no scripts/run_job.sh" "$log" || fail "home: no error naming PACKBERT_HOME"
echo "6. a copy outside the repository: FAILED, naming what it tried; PACKBERT_HOME=$work: FAILED, naming it"

echo "times: submit to running $(secs "$t_submit" "$t_running") s (first step after $(secs "$t_submit" "$t_first_step") s);" \
  "SIGTERM to checkpoint $(secs "$t_term" "$t_checkpoint") s; SIGTERM to requeued $(secs "$t_term" "$t_requeued") s;" \
  "requeued to running again $(secs "$t_requeued" "$t_rerunning") s (Slurm held it ${held} s: cred_expire);" \
  "requeued to the resumed step $(secs "$t_requeued" "$t_resumed") s;" \
  "kill of a rank to the job's end $kill_s s; the whole test $(secs "$t_start" "$(now)") s"
echo "ok"
