# The host lock (orchestrator/containers/locks.py says who takes what), held
# by this shell until its stdin closes.
#
#   lock.sh LOCKDIR s|x WAIT DESCRIPTION [PROGRAM ARGS…]
#
# LOCKDIR is locked with flock(1) shared (s) or exclusive (x), waiting up to
# WAIT seconds ("no": not at all); DESCRIPTION is the holder line other
# invocations are shown. PROGRAM (the probe) then runs in a subshell under
# the lock with ARGS as its arguments (its traps are its own), `@@cvs:ready`
# follows, and the shell holds the lock until stdin closes. A `shared` line on
# stdin converts the lock (flock converts in place, never blocks here: we hold
# it exclusively).
#
# Frames: `@@cvs:lock held s|x | busy | waiting | timeout | noflock | error
# TEXT`, `@@cvs:holder LINE`, then `@@cvs:ready`.
# `test -ef` is not POSIX, but dash, bash and busybox sh have it (the shell
# tests run this under each).
# shellcheck disable=SC3013
lock=$1 mode=$2 wait=$3 desc=$4
shift 4
if ! command -v flock >/dev/null 2>&1; then
  echo '@@cvs:lock noflock'
  exit 0
fi
holders() {
  for f in "$lock"/h.*; do
    [ -f "$f" ] || continue
    while IFS= read -r l; do printf '@@cvs:holder %s\n' "$l"; done <"$f"
  done
}
check=yes
[ -e "/proc/$$/fd/0" ] || check=no
take() {
  tries=0
  while :; do
    mkdir -m 777 "$lock" 2>/dev/null
    if command exec 9<"$lock" 2>/dev/null; then
      flock "-$mode" "$@" 9 || return 1
      # The path must still name what we locked: the last holder may have
      # removed it meanwhile (then lock the new one instead).
      if [ "$check" = no ] || [ "$lock" -ef "/proc/$$/fd/9" ]; then return 0; fi
      exec 9<&-
    fi
    tries=$((tries + 1))
    if [ "$tries" -gt 20 ]; then
      echo "@@cvs:lock error cannot open $lock"
      exit 0
    fi
  done
}
# shellcheck disable=SC2317  # run by the EXIT trap
release() {
  # Unlock by closing the shell's descriptor, the last one open on the lock
  # (flock(1) has exited, and commands got it closed or have ended).
  exec 9<&-
  # Then the last one out removes the directory, holder lines and all, taking
  # it exclusively and only while the path still names it; a waiter that took
  # the lock over meanwhile keeps it, and only our own holder line goes.
  if [ "$check" = yes ] && command exec 9<"$lock" 2>/dev/null && flock -xn 9 &&
      [ "$lock" -ef "/proc/$$/fd/9" ]; then
    rm -rf "$lock"
  else
    rm -f "$info"
  fi
}
if take -n; then
  :
elif [ "$wait" = no ]; then
  holders
  echo '@@cvs:lock busy'
  exit 0
else
  holders
  echo '@@cvs:lock waiting'
  if ! take -w "$wait"; then
    holders
    echo '@@cvs:lock timeout'
    exit 0
  fi
fi
info="$lock/h.$$"
trap release EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
printf '%s\n' "$desc" >"$info" 2>/dev/null
echo "@@cvs:lock held $mode"
if [ $# -gt 0 ]; then
  # A subshell, as the program would have in `sh -c`: its traps, variables
  # and exit are its own, and no process is spent on a new shell.
  (
    _cvs_program=$1
    shift
    eval "$_cvs_program"
  )
fi
echo '@@cvs:ready'
while read -r cmd; do
  case $cmd in
    shared) flock -s 9 && echo '@@cvs:lock held s' ;;
  esac
done
exit 0
