# A feeder of an image spread (containers/spread.py) that has the image:
# its archive on stdout.
#
#   spread_send.sh RUNTIME… save [--format docker-archive] NAME:TAG
#
# Saved by name and tag (by ID it would load untagged). The shell stays the
# session's first process and on TERM, HUP or INT ends its whole process
# group, the runtime's CLI included (as bounded.sh does).
"$@" &
child=$!
trap 'trap "" TERM HUP INT; kill -TERM 0; kill -TERM 0; kill -TERM 0; sleep 0.3; kill -KILL 0' TERM HUP INT
wait "$child"
