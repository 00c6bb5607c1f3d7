# Ties per_run containers to a Slurm job. cvs starts it as one step of the
# job on every node (`srun --overlap`, one task per node); it prints a ready
# line and waits. When Slurm ends the step (the job completed, was
# cancelled, hit its time limit), the SIGTERM it sends makes the holder
# remove its node's container by ID and exit. A container already removed
# (`cvs down`) is not an error. Never calls a Slurm command.
#
#   slurm_holder.sh NODE=ID... -- RUNTIME...
#     NODE=ID   the container this node holds ($SLURMD_NODENAME picks it)
#     RUNTIME   the runtime's argv prefix on the nodes (docker, sudo -n podman)
me=${SLURMD_NODENAME:-}
id=
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  case $1 in "$me="*) id=${1#"$me="} ;; esac
  shift
done
[ $# -gt 0 ] && shift
if [ -z "$me" ] || [ -z "$id" ] || [ $# -eq 0 ]; then
  echo "cvs-holder: no container for node '$me'" >&2
  exit 2
fi
case $id in *[!0-9a-f]*) echo "cvs-holder: bad container ID" >&2; exit 2 ;; esac
release() {
  "$@" rm -f -v "$id" >/dev/null 2>&1
  echo "removed $me $id"
  exit 0
}
# "$@" is the runtime's argv from here on (never shifted again).
trap 'release "$@"' TERM INT HUP
echo "ready $me $id"
# A short sleep in the foreground: the trap runs within a second of the
# signal, and no background sleep is left behind (one killed while it is
# still between fork and exec would miss the signal).
while :; do
  sleep 1
done
