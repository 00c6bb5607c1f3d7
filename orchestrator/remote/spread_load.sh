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
fwd=$1
shift
if [ "$fwd" = 1 ]; then
  { tee /dev/fd/3 | "$@" >&2; } 3>&1
else
  "$@" >&2
fi
