# In the head container, as root: can an MPI launch start from here?
#
#   mpi_check.sh SECONDS HOSTFILE NEED_MPIRUN PEER...
#
# For every PEER (its name as the cluster's ssh config knows it), one
# `ssh PEER true` through the container's ~/.ssh/config (the peer's sshd
# port, the cluster key, strict checking against the cluster's known hosts),
# all at once, each bounded by SECONDS. NEED_MPIRUN 1: also say whether
# Open MPI's `mpirun` is on the PATH. Prints (parsed by containers/mpi.py):
#   mpirun PATH | mpirun-missing     (NEED_MPIRUN 1 only)
#   ssh-missing                      (no ssh client: peers not checked)
#   peer-ok NAME | peer-fail NAME REASON
#   hostfile LINE                    (each line of HOSTFILE)
# and exits 0: the facts are the answer.
secs=$1 hostfile=$2 need_mpirun=$3
shift 3
if [ "$need_mpirun" = 1 ]; then
  if p=$(command -v mpirun 2>/dev/null); then echo "mpirun $p"; else echo "mpirun-missing"; fi
fi
if [ -r "$hostfile" ]; then
  while IFS= read -r line; do echo "hostfile $line"; done <"$hostfile"
fi
if ! command -v ssh >/dev/null 2>&1; then
  echo "ssh-missing"
  exit 0
fi
bound=''
command -v timeout >/dev/null 2>&1 && bound="timeout $secs"
dir=$(mktemp -d 2>/dev/null) || { dir=/tmp/cvs-mpi-check.$$; mkdir "$dir" || exit 1; }
trap 'rm -rf "$dir"' EXIT
i=0
for peer in "$@"; do
  i=$((i + 1))
  # shellcheck disable=SC2086  # $bound is empty or two words
  (
    $bound ssh -n -o ConnectTimeout="$secs" "$peer" true >"$dir/$i.out" 2>"$dir/$i.err"
    echo $? >"$dir/$i.rc"
  ) &
done
wait
i=0
for peer in "$@"; do
  i=$((i + 1))
  rc=$(cat "$dir/$i.rc" 2>/dev/null)
  if [ "$rc" = 0 ]; then
    echo "peer-ok $peer"
    continue
  fi
  why=$(grep -v '^Warning: Permanently added' "$dir/$i.err" | tail -n 1 | tr -cd '[:print:]')
  [ "$rc" = 124 ] && why="no answer within ${secs}s"
  [ -n "$why" ] || why="ssh exited $rc"
  echo "peer-fail $peer $why"
done
