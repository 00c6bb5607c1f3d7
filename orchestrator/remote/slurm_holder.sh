# Ties the containers one cvs invocation starts inside a Slurm job to that
# job. cvs starts it as one step of the job on every node (`srun --overlap`,
# one task per node) BEFORE it starts any container; it prints a ready line
# and waits. When Slurm ends the step (the job completed, was cancelled, hit
# its time limit), the SIGTERM it sends makes the holder remove its node's
# containers labelled with this job and this invocation, by ID. It sweeps
# again every second until Slurm's SIGKILL (KillWait later) or ten sweeps: a
# `docker run` of an `up` cut short by the same scancel may still be creating
# one. Nothing to remove is not an error. Never calls a Slurm command.
#
#   slurm_holder.sh JOB INVOCATION -- RUNTIME...
#     JOB         the job's ID (label io.cvs.slurm-job)
#     INVOCATION  the invocation's ID (label io.cvs.invocation)
#     RUNTIME     the runtime's argv prefix on the nodes (docker, sudo -n podman)
me=${SLURMD_NODENAME:-}
job=${1:-}
inv=${2:-}
case $job in '' | *[!0-9]*) echo "cvs-holder: bad job ID" >&2; exit 2 ;; esac
case $inv in '' | *[!0-9a-f]*) echo "cvs-holder: bad invocation ID" >&2; exit 2 ;; esac
shift 2
[ "${1:-}" = -- ] && shift
if [ $# -eq 0 ]; then
  echo "cvs-holder: no runtime" >&2
  exit 2
fi
sweep() {
  ids=$("$@" ps -aq --no-trunc --filter "label=io.cvs.slurm-job=$job" \
    --filter "label=io.cvs.invocation=$inv" 2>/dev/null) || return 0
  for id in $ids; do
    case $id in *[!0-9a-f]*) continue ;; esac
    "$@" rm -f -v "$id" >/dev/null 2>&1 && echo "removed $me $id"
  done
  return 0
}
ended=0
# "$@" is the runtime's argv from here on (never shifted again).
trap 'ended=1' TERM INT HUP
echo "ready $me $job $inv"
# A short sleep in the foreground: the trap is seen within a second of the
# signal, and no background sleep is left behind.
n=0
while :; do
  if [ "$ended" = 1 ]; then
    sweep "$@"
    n=$((n + 1))
    [ "$n" -ge 10 ] && exit 0
  fi
  sleep 1
done
