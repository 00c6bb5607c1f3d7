# A feeder of an image spread (containers/spread.py) that has the image:
# its archive on stdout.
#
#   spread_send.sh DRAIN RUNTIME… save [--format docker-archive] NAME:TAG
#
# Saved by name and tag (by ID it would load untagged). The shell stays the
# session's first process and on TERM, HUP or INT ends its whole process
# group, the runtime's CLI included (as bounded.sh does).
#
# DRAIN 1 (podman): a save cut short runs to its end into /dev/null, in a
# session of its own (setsid: sshd sends cvs's TERM to the whole process
# group), behind a GNU `tee -p` that goes on into /dev/null once its reader
# (cvs's channel) is gone. podman (4.x) writes a save to stdout through a
# fifo and a copy of each layer under /var/tmp and removes them only when
# the save returns: TERMed, or killed by SIGPIPE, it leaves an image's
# size there. The save then ends on its own, within the time of a save.
# Without setsid or `tee -p` on the host, the save runs as with DRAIN 0.
drain=$1
shift
trap 'trap "" TERM HUP INT; kill -TERM 0; kill -TERM 0; kill -TERM 0; sleep 0.3; kill -KILL 0' TERM HUP INT
if [ "$drain" = 1 ] && command -v setsid >/dev/null 2>&1 && tee -p </dev/null >/dev/null 2>&1; then
  setsid "$@" | setsid tee -p /dev/null &
else
  "$@" &
fi
child=$!
wait "$child"
