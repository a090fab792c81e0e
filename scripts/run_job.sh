#!/usr/bin/env bash
# Runs the launcher of a `packbert train` job (mpirun, srun), passes a stop signal on to it, and
# exits 0 when the run ended cleanly: finished, or stopped on a signal with its checkpoint
# written. The launch scripts end with it (run_mlperf_8gpu.sh, slurm_bert_large.sbatch).
#
#   scripts/run_job.sh [--forward SIG] [--on-stop COMMAND] END_FILE LAUNCHER [ARG...]
#
# END_FILE is the run's log.end_file: rank 0 writes it last, after the final checkpoint is
# complete (docs/training.md, Faults), so it tells a clean stop from a failure. This script
# removes an old one before it starts the launcher.
#
# Why a script around the launcher:
# - bash lets a foreground command run to its end before it handles a signal, and without a
#   trap it dies of SIGTERM, leaving the job running. Here the launcher runs in the background,
#   in a process group of its own, and SIGTERM, SIGINT or SIGHUP to this script (or to its
#   process group: Ctrl-C) is sent on to it as SIG (default TERM: srun passes it on to every
#   task). mpirun needs USR1: on SIGTERM it gives the ranks one second before SIGKILL
#   (odls_base_sigkill_timeout), too little for a large checkpoint; SIGUSR1 it passes on to
#   every rank and waits for them, and packbert stops on it as on SIGTERM.
# - mpirun exits 1 after it passed on a SIGTERM, even when every rank stopped cleanly and
#   exited 0; the end file says what happened.
#
# Exit status:
# - END_FILE says the run stopped on a signal: 0 when the checkpoint it names exists, else 1
#   (no checkpoint.dir: nothing to resume from); with --on-stop, a stop with its checkpoint
#   then runs COMMAND (bash -c, in this environment, with RUN_JOB_CHECKPOINT set to the
#   checkpoint) and exits with its status (slurm_bert_large.sbatch requeues the job there);
# - END_FILE says it finished or reached its target: 0 after a signal was passed on (the
#   launcher's own status then tells of the signal, not of the run), else the launcher's;
# - no END_FILE: the launcher's status (the run failed, never started, or only printed).
set -uo pipefail

forward=TERM
on_stop=
while [ $# -ge 2 ]; do
  case "$1" in
    --forward) forward=$2; shift 2 ;;
    --on-stop) on_stop=$2; shift 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ] || ! kill -l "$forward" > /dev/null 2>&1; then
  echo "usage: $0 [--forward SIG] [--on-stop COMMAND] END_FILE LAUNCHER [ARG...]" >&2
  exit 2
fi
end_file=$1; shift
launcher=$1

# The traps come first, so that no signal is lost while the launcher starts; one that arrives
# before it runs is passed on as soon as it does.
pid=
passed_on=0
# shellcheck disable=SC2317  # called by the traps below
pass_on() {  # pass_on SIGNAL_RECEIVED
  echo "run_job: SIG$1 received, SIG$forward sent to $launcher${pid:+ (pid $pid)}: the ranks" \
    "stop after the step in flight" >&2
  passed_on=1
  if [ -n "$pid" ]; then kill -s "$forward" "$pid" 2>/dev/null; fi
}
for sig in TERM INT HUP; do
  # shellcheck disable=SC2064  # $sig is meant to be expanded now
  trap "pass_on $sig" "$sig"
done

rm -f "$end_file"
# The launcher gets a process group of its own (job control on for this one command): Ctrl-C
# in a terminal signals the whole foreground group, and mpirun, were it in it, would SIGKILL
# the ranks a second later. So only this script gets it, and passes it on. Its input is
# /dev/null: a background group that reads the terminal is stopped. (A started command's
# trapped signals are back at their defaults.)
set -m
"$@" < /dev/null &
pid=$!
set +m
if [ "$passed_on" -eq 1 ]; then kill -s "$forward" "$pid" 2>/dev/null; fi

# A trapped signal ends `wait` early (status > 128) while the launcher still runs: wait again
# until it is gone. Then one more `wait` returns its own status, in case the last one was cut
# short just as it ended (bash keeps the status of a reaped child; 127 where it does not).
while :; do
  wait "$pid"
  status=$?
  kill -0 "$pid" 2>/dev/null || break
done
wait "$pid" 2>/dev/null
s=$?
[ "$s" -ne 127 ] && status=$s
trap - TERM INT HUP

# The end file is one JSON line written by packbert (train/metrics.h, RunEnd).
field() { sed -n "s/.*\"$1\":\(\"\([^\"]*\)\"\|\([0-9a-z]*\)\).*/\2\3/p" "$end_file"; }
if [ ! -f "$end_file" ]; then
  echo "run_job: $launcher exited $status, and the run wrote no $end_file (it failed, or" \
    "did not train)" >&2
  exit "$status"
fi
reason=$(field reason) step=$(field step) checkpoint=$(field checkpoint)
if [ "$reason" = signal ]; then
  if [ -n "$checkpoint" ] && [ "$checkpoint" != null ] && [ -d "$checkpoint" ]; then
    echo "run_job: stopped by signal $(field signal) after step $step, checkpoint" \
      "$checkpoint ($launcher exited $status)" >&2
    [ -z "$on_stop" ] && exit 0
    RUN_JOB_CHECKPOINT=$checkpoint bash -c "$on_stop"
    exit
  fi
  echo "run_job: stopped by signal $(field signal) after step $step without a checkpoint" \
    "(checkpoint: $checkpoint; $launcher exited $status)" >&2
  exit 1
fi
echo "run_job: $reason after step $step ($launcher exited $status)" >&2
[ "$passed_on" -eq 1 ] && exit 0
exit "$status"
