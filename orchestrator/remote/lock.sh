# The host lock (orchestrator/containers/locks.py says who takes what), held
# by this shell until its stdin closes.
#
#   lock.sh LOCKDIR s|x WAIT DESCRIPTION LEASE [PROGRAM ARGS…]
#
# LOCKDIR is locked with flock(1) shared (s) or exclusive (x), waiting up to
# WAIT seconds ("no": not at all); DESCRIPTION is the holder line other
# invocations are shown. PROGRAM (the probe) then runs in a subshell under
# the lock with ARGS as its arguments (its traps are its own), `@@cvs:ready`
# follows, and the shell holds the lock until stdin closes. A `shared` line on
# stdin converts the lock (flock converts in place, never blocks here: we hold
# it exclusively).
#
# The lease (issue 22): LEASE is `TICK:EMPTY` ("none": no lease). The
# coordinator writes a line (`renew`) every few seconds (containers/locks.py,
# LeaseRenewer); a watcher looks every TICK seconds (a fraction is allowed
# where sleep(1) takes one, as GNU's and busybox's do: the tests shrink it)
# and lets go of the lock after EMPTY looks in a row that found no line since
# the one before. The lock is therefore let go (EMPTY, EMPTY + 1] ticks after
# the last line: with 5:3, 15 to 20 s. A coordinator that died, or whose
# packets no longer arrive (a silent network: the host's sshd notices the dead
# connection only after minutes to hours), so holds the lock that long at
# most after its last word. A write to a channel that is gone (SIGPIPE)
# releases too.
#
# The guard (issue 42): the commands this invocation runs in the container
# end with its lock. A line `guard TOKEN`, then shell text for this host up
# to a line TOKEN, sets what ends them (containers/locks.py, HostLocks.guard:
# a kill of every command of the invocation through the runtime). A line
# `release` says the invocation lets go in order (its commands are done or
# were ended by cvs itself); when the shell ends any other way (stdin closed
# by a coordinator that died, the lease run out, a signal), it runs the
# guard first, bounded (20 s, where timeout(1) exists), with no
# output: the commands go within the same bound as the lock.
#
# Frames: `@@cvs:lock held s|x | busy | waiting | timeout | noflock | error
# TEXT`, `@@cvs:holder LINE`, then `@@cvs:ready`.
# `test -ef` is not POSIX, but dash, bash and busybox sh have it (the shell
# tests run this under each).
# shellcheck disable=SC3013
lock=$1 mode=$2 wait=$3 desc=$4 lease=$5
shift 5
tick=${lease%%:*} empty=${lease#*:}
if ! command -v flock >/dev/null 2>&1; then
  echo '@@cvs:lock noflock'
  exit 0
fi
holders() {
  for f in "$lock"/h.*; do
    [ -f "$f" ] || continue
    # A line whose shell is gone (killed with -9) names no holder.
    if [ "$check" = yes ] && [ ! -d "/proc/${f##*/h.}" ]; then continue; fi
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
  # The lease's watcher first, and waited for: once it is gone it cannot
  # write in the directory while the last one out removes it. KILL: a TERM
  # that arrives before the new subshell has reset our traps is lost (dash),
  # and the watcher has nothing to clean up.
  if [ -n "$watcher" ]; then
    kill -9 "$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
  fi
  if [ -n "$guard" ] && [ "$orderly" != yes ]; then
    if command -v timeout >/dev/null 2>&1; then
      timeout 20 sh -c "$guard" </dev/null >/dev/null 2>&1
    else
      sh -c "$guard" </dev/null >/dev/null 2>&1
    fi
  fi
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
    rm -f "$info" "$token"
  fi
}
# shellcheck disable=SC2317  # a background job
watch_lease() {
  # The watcher keeps no descriptor of ours: not the lock (fd 9: the lock
  # must go with this shell), not the channel. Each line on stdin lays down a
  # token (r.PID); every TICK seconds the watcher takes it (rm: unlink is
  # atomic, and fails when there is none); after EMPTY looks in a row without
  # one it sends this shell TERM, whose trap releases. (It starts after the
  # program under the lock: this shell then only waits on stdin.) No file
  # times are compared: busybox's `test -nt` counts whole seconds, which would
  # tie the lease to seconds too.
  (
    exec 9<&- </dev/null >/dev/null 2>&1
    missed=0
    while :; do
      sleep "$tick"
      kill -0 "$$" || exit 0
      if rm "$token"; then missed=0; else missed=$((missed + 1)); fi
      [ "$missed" -lt "$empty" ] || { kill -TERM "$$"; exit 0; }
    done
  ) &
  watcher=$!
}
watcher='' guard='' orderly=''
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
info="$lock/h.$$" token="$lock/r.$$"
trap release EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 141' PIPE
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
case $lease in none) ;; *) watch_lease ;; esac
while IFS= read -r cmd; do
  # Any line renews the lease: it lays down the token the watcher takes.
  # (`true`, a regular builtin: a failed redirection on `:` ends the shell.)
  true 2>/dev/null >"$token"
  case $cmd in
    shared) flock -s 9 && echo '@@cvs:lock held s' ;;
    release) orderly=yes ;;
    'guard '*)
      # Taken only whole: a coordinator that died while writing it set none.
      end=${cmd#guard } text='' whole=''
      while IFS= read -r line; do
        [ "$line" = "$end" ] && { whole=yes; break; }
        text="$text$line
"
      done
      [ -z "$whole" ] || guard=$text ;;
  esac
done
exit 0
