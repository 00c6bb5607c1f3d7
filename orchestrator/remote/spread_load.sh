# A receiver of an image spread (containers/spread.py): the image's archive
# on stdin into `RUNTIME load`. With FORWARD 1 the same bytes also leave on
# stdout as they arrive, for the hosts this one feeds: it passes the image
# on while loading it (a pipelined relay), and nothing lands in a file.
#
#   spread_load.sh FORWARD RUNTIME… load
#
# load's own report goes to stderr (stdout carries only the image's bytes).
# The exit status is load's: a cut or corrupted stream fails it, and the
# runtime then tags nothing. The shell stays the session's first process
# and on TERM, HUP or INT ends its whole process group (as bounded.sh does:
# the docker CLI outlives a single TERM). A background job's stdin is
# /dev/null unless redirected: the channel's stdin goes to it through fd 4.
fwd=$1
shift
exec 4<&0
if [ "$fwd" = 1 ]; then
  { tee /dev/fd/3 | "$@" >&2; } 3>&1 <&4 &
else
  "$@" >&2 <&4 &
fi
child=$!
exec 4<&-
trap 'trap "" TERM HUP INT; kill -TERM 0; kill -TERM 0; kill -TERM 0; sleep 0.3; kill -KILL 0' TERM HUP INT
wait "$child"
