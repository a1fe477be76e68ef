#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for tests and for trying `gyre launch slurm`:
#
#   tools/slurm-local.sh start DIR [NODES]   # munged, slurmctld and NODES slurmd (default 3)
#   export SLURM_CONF=DIR/slurm.conf         # then sbatch, squeue, scancel, gyre launch slurm
#   tools/slurm-local.sh stop DIR            # stops the daemons it started
#
# Everything lives in DIR: slurm.conf, a fresh munge key and socket, state, spool, logs. The
# nodes (gyre1..gyreN, 4 CPUs each) are slurmd processes on this host at 127.0.0.1, each on its
# own port, so a heterogeneous job's components can land on different "nodes" as on a real
# cluster. Ports are picked free. Needs root (slurmd runs jobs as their users) and the Debian
# packages slurm-wlm and munge (tools/install-deps.sh). Nothing outside DIR is touched.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
cmd="$1"
dir="$(mkdir -p "$2" && cd "$2" && pwd)"
nodes="${3:-3}"

stop() {
  for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [[ -f "$pidfile" ]] || continue
    pid=$(cat "$pidfile" 2>/dev/null || true)
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
  done
  # Wait for them to go (slurmd ends its jobs' steps first).
  for _ in $(seq 1 50); do
    alive=0
    for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
      [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
    done
    [[ $alive == 0 ]] && break
    sleep 0.2
  done
  rm -f "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "$cmd" in
  stop) stop; echo "slurm-local: stopped the daemons of $dir"; exit 0 ;;
  start) ;;
  *) usage ;;
esac

[[ $(id -u) -eq 0 ]] || { echo "slurm-local: needs root (slurmd runs jobs as their users)" >&2; exit 77; }
for bin in munged slurmctld slurmd sbatch sinfo; do
  command -v "$bin" >/dev/null || [[ -x "/usr/sbin/$bin" ]] || {
    echo "slurm-local: $bin not found (Debian packages slurm-wlm and munge)" >&2; exit 77; }
done
export PATH="$PATH:/usr/sbin"
stop
rm -rf "$dir/state" "$dir/spool" "$dir/log"
mkdir -p "$dir/state" "$dir/log"
host=$(hostname)

# munge: a fresh key and a private socket.
head -c 1024 /dev/urandom > "$dir/munge.key"
chmod 600 "$dir/munge.key"
munged -f --socket="$dir/munge.sock" --key-file="$dir/munge.key" --log-file="$dir/log/munged.log" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed"

ctl_port=$(free_port)
{
  echo "# Written by tools/slurm-local.sh: a single-host Slurm cluster for Gyre's tests."
  echo "ClusterName=gyrelocal"
  echo "SlurmctldHost=${host}(127.0.0.1)"
  echo "SlurmctldPort=${ctl_port}"
  echo "AuthType=auth/munge"
  echo "AuthInfo=socket=${dir}/munge.sock"
  echo "CredType=cred/munge"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "StateSaveLocation=${dir}/state"
  echo "SlurmdSpoolDir=${dir}/spool/%n"
  echo "SlurmctldPidFile=${dir}/slurmctld.pid"
  echo "SlurmdPidFile=${dir}/slurmd-%n.pid"
  echo "SlurmctldLogFile=${dir}/log/slurmctld.log"
  echo "SlurmdLogFile=${dir}/log/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "SchedulerType=sched/backfill"
  echo "SchedulerParameters=bf_interval=1"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "DefMemPerCPU=100"
  echo "ReturnToService=2"
  echo "SlurmdParameters=config_overrides"
  echo "KillWait=10"
  for i in $(seq 1 "$nodes"); do
    echo "NodeName=gyre${i} NodeHostname=${host} NodeAddr=127.0.0.1 Port=$(free_port) CPUs=4 RealMemory=4000 State=UNKNOWN"
  done
  echo "PartitionName=local Nodes=gyre[1-${nodes}] Default=YES MaxTime=120 DefaultTime=60 State=UP OverSubscribe=YES"
} > "$dir/slurm.conf"
export SLURM_CONF="$dir/slurm.conf"

slurmctld -i
for i in $(seq 1 "$nodes"); do
  mkdir -p "$dir/spool/gyre${i}"
  slurmd -N "gyre${i}"
done
for _ in $(seq 1 100); do
  idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | wc -l)
  [[ "$idle" -ge "$nodes" ]] && break
  sleep 0.2
done
if [[ "$idle" -lt "$nodes" ]]; then
  echo "slurm-local: only $idle of $nodes nodes came up; logs in $dir/log" >&2
  sinfo >&2 || true
  exit 1
fi
echo "slurm-local: $nodes nodes up; export SLURM_CONF=$dir/slurm.conf"
