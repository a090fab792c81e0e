#!/usr/bin/env bash
# A one-node Slurm cluster in a directory, for the tests (tests/slurm/test_sbatch.sh): munged,
# slurmctld and slurmd from Debian's packages (scripts/install_deps.sh --tests), each with its own
# key, socket, state, spool and log under DIR, on ports of their own, so that nothing of a
# system-wide Slurm or munge is used or touched.
#
#   tests/slurm/mini_slurm.sh start DIR   write DIR/slurm.conf, start the daemons, wait until the
#                                         node is idle; then `export SLURM_CONF=DIR/slurm.conf`
#                                         makes sbatch, srun, scontrol and squeue use it
#   tests/slurm/mini_slurm.sh stop DIR    stop the daemons started in DIR (their pid files)
#
# MINI_SLURM_CRED_EXPIRE=SECONDS sets AuthInfo's cred_expire: Slurm keeps a requeued job pending
# that long before it may start again (EligibleTime; Slurm's default 120 s).
#
# Needs root: slurmd starts the tasks as the submitting user. The configuration is the plainest
# that runs the sbatch script as a real cluster would: select/cons_tres with CR_Core (CPUs are
# allocated by core), task/affinity (each task bound to its CPUs), proctrack/linuxproc (no
# cgroups), MpiDefault=pmix, KillWait=30 (Slurm's default: the seconds between the SIGTERM that
# ends a step and the SIGKILL), JobRequeue=1, MinJobAge=600 (finished jobs stay visible to
# scontrol: there is no accounting database, so no sacct). The node's CPUs and memory are the
# machine's (slurmd -C).
set -euo pipefail

cmd=${1:-} dir=${2:-}
if [[ -z $cmd || -z $dir ]] || [[ $cmd != start && $cmd != stop ]]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi

stop_daemons() {
  local name pid i
  for name in slurmd slurmctld munged; do
    [[ -f $dir/$name.pid ]] || continue
    pid=$(cat "$dir/$name.pid")
    rm -f "$dir/$name.pid"
    if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then continue; fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; ++i)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

if [[ $cmd == stop ]]; then
  stop_daemons
  exit 0
fi

for tool in munged slurmctld slurmd sbatch scontrol; do
  command -v "$tool" > /dev/null || { echo "mini_slurm: $tool is not installed" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "mini_slurm: slurmd must run as root" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir"/{state,spool,log}
dir=$(cd "$dir" && pwd)
chmod 0755 "$dir"

# Two free TCP ports (the kernel's choice; free when we ask, as good as it gets without a lock).
read -r ctld_port slurmd_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)

host=$(hostname -s)
node=$(slurmd -C | head -n 1)  # NodeName=HOST CPUs=.. Boards=.. ... RealMemory=..
cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$node")
sockets=$(sed -n 's/.* SocketsPerBoard=\([0-9]*\).*/\1/p' <<< "$node")
cores=$(sed -n 's/.* CoresPerSocket=\([0-9]*\).*/\1/p' <<< "$node")
threads=$(sed -n 's/.* ThreadsPerCore=\([0-9]*\).*/\1/p' <<< "$node")
memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$node")

# munge: a key of its own and a socket in DIR (--force: DIR may lie under a world-writable /tmp).
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge.key"
munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munged.seed"

cat > "$dir/slurm.conf" <<EOF
ClusterName=packbert-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket,cred_expire=${MINI_SLURM_CRED_EXPIRE:-120}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=pmix
KillWait=30
JobRequeue=1
MinJobAge=600
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$memory State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$dir/slurm.conf

# -D: in the foreground of a background job of ours (its pid is the daemon's); -c: no old state.
slurmctld -D -c -i -f "$SLURM_CONF" > "$dir/log/slurmctld.out" 2>&1 &
echo $! > "$dir/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" > "$dir/log/slurmd.out" 2>&1 &
echo $! > "$dir/slurmd.pid"

# Up when the node is idle (slurmd registered with slurmctld).
for ((i = 0; i < 300; ++i)); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  if [[ $state == idle ]]; then
    echo "mini_slurm: node $host idle ($cpus CPUs), SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  for name in slurmctld slurmd; do
    if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
      echo "mini_slurm: $name exited; its log:" >&2
      tail -n 20 "$dir/log/$name.log" "$dir/log/$name.out" >&2 2>/dev/null || true
      stop_daemons
      exit 1
    fi
  done
  sleep 0.1
done
echo "mini_slurm: node $host not idle after 30 s (state: ${state:-none})" >&2
tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 2>/dev/null || true
stop_daemons
exit 1
