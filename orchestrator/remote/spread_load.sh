# A receiver of an image spread (containers/spread.py): the image's archive
# on stdin into `RUNTIME load`. With FORWARD 1 the same bytes also leave on
# stdout as they arrive, for the hosts this one feeds: it passes the image
# on while loading it (a pipelined relay), and nothing lands in a file.
#
#   spread_load.sh FORWARD RUNTIME… load
#
# load's own report goes to stderr (stdout carries only the image's bytes).
# The exit status is load's: a cut or corrupted stream fails it, and the
# runtime then tags nothing.
#
# A cut (cvs's TERM, which sshd sends to the session's whole process group,
# or its channel closing) ends the load through its input, never with a
# signal: the load reads the stream through a feeder (tee, or cat) and runs
# in a session of its own (setsid), out of reach of the signals that end
# the feeder; it then reads a cut archive and fails on its own. podman
# (4.x) copies an archive it loads from stdin to a file under its TMPDIR
# (/var/tmp: sudo keeps no TMPDIR) and removes it only when the load
# returns: TERMed or killed, it leaves the copy there (an image's size on
# every host). A load still running 5 s after its feeder ended is TERMed,
# then killed (the docker CLI outlives a single TERM). Without setsid on the
# host the load stays in this group, and the first TERM ends it too.
# A background job's stdin is /dev/null unless redirected: the channel's
# stdin goes to the feeder through fd 4.
fwd=$1
shift
child=''
# shellcheck disable=SC2317  # run by the trap below
stop() {
  trap '' TERM HUP INT
  kill -TERM 0 2>/dev/null # the feeder (the load is not in this group)
  n=0
  while [ -n "$child" ] && [ "$n" -lt 50 ]; do
    # Gone, or a zombie not yet reaped: the load has ended.
    state=$(awk '{ print $3 }' "/proc/$child/stat" 2>/dev/null)
    case $state in '' | Z | X) break ;; esac
    sleep 0.1
    n=$((n + 1))
  done
  # The load's session: its leader is the load (setsid ran it in place).
  if [ -n "$child" ] && kill -TERM "-$child" 2>/dev/null; then
    sleep 0.3
    kill -KILL "-$child" 2>/dev/null
  fi
  kill -KILL 0
}
trap 'stop' TERM HUP INT
own=''
if command -v setsid >/dev/null 2>&1; then own=setsid; fi
exec 4<&0 3>&1
# $own: empty, or setsid (one word).
# shellcheck disable=SC2086
if [ "$fwd" = 1 ]; then
  tee /dev/fd/3 <&4 | $own "$@" >&2 3>&- 4<&- &
else
  cat <&4 | $own "$@" >&2 3>&- 4<&- &
fi
child=$!
exec 4<&- 3>&-
wait "$child"
