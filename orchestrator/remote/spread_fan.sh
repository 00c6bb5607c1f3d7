# One host's part of a direct image spread (containers/spread.py): copied
# into the lease's directory (spread_lease.sh) and run from there, by the
# coordinator on the seed, or by sshd as the forced command of the key a
# feeder connects with on a receiver.
#
#   sh DIR/fan.sh DIR [send]
#
# DIR/cmd: the local command, one argument a line (with `send`, on the seed:
# `docker save … IMAGE`, whose output is the stream; else, on a receiver:
# `docker load`, whose input is the stream). DIR/drain, on the seed: its
# save cut short runs to its end (podman; spread_send.sh). DIR/kids: `N USER ADDRESS PORT` a line, the hosts
# this one feeds, each reached with ssh using DIR/key.N and only the host
# keys in DIR/known_hosts (nothing of the user's ssh config). The stream goes
# to every kid as it arrives (tee into a fifo per kid) while it loads: a
# pipelined relay. `@@cvs:kid N STATUS` on stderr says how each kid's
# ssh (its load, its own kids) ended. The exit status is the local
# command's. A receiver writes DIR/fan.pid (this shell) and DIR/tee.pid
# (what reads the stream) for its lease's `watch` and `cut`. On TERM, HUP or INT the whole process group ends; on the seed
# also when stdin (cvs's channel) closes.
dir=$1 mode=${2:-load}
exec 4<&0
set --
while IFS= read -r a; do set -- "$@" "$a"; done <"$dir/cmd"
fifos=''
pids=''
if [ -s "$dir/kids" ]; then
  while read -r n user addr port; do
    mkfifo "$dir/f.$n" || exit 1
    ssh -F /dev/null -i "$dir/key.$n" -o IdentitiesOnly=yes -o BatchMode=yes \
      -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$dir/known_hosts" \
      -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=10 \
      -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \
      -p "$port" -l "$user" "$addr" cvs-spread <"$dir/f.$n" >/dev/null 2>"$dir/e.$n" &
    pids="$pids $n:$!"
    fifos="$fifos $dir/f.$n"
  done <"$dir/kids"
fi
# On TERM (the lease's `cut`), HUP or INT: a receiver first ends the tee,
# so that its load reads a cut archive and fails on its own, and waits for
# it (5 s at most): podman (4.x) copies an archive it loads from stdin to a
# file under its TMPDIR (/var/tmp: sudo keeps no TMPDIR) and removes it only
# when the load returns; TERMed or killed, it leaves the copy there (an
# image's size, on every cut). Then the whole process group ends.
feed='' child=''
# shellcheck disable=SC2317  # run by the trap below
stop() {
  trap '' TERM HUP INT
  if [ -n "$feed" ] && [ -n "$child" ]; then
    kill -TERM "$feed" 2>/dev/null
    n=0
    while [ "$n" -lt 50 ]; do
      # Gone, or a zombie not yet reaped: the load has ended.
      state=$(awk '{ print $3 }' "/proc/$child/stat" 2>/dev/null)
      case $state in '' | Z | X) break ;; esac
      sleep 0.1
      n=$((n + 1))
    done
  fi
  kill -TERM 0
  sleep 0.3
  kill -KILL 0
}
trap 'stop' TERM HUP INT
# GNU tee's -p: a reader that is gone (a kid's ssh, or this host's own load)
# does not end the stream to the others; a tee without it ends on the first.
tp=''
if tee -p </dev/null >/dev/null 2>&1; then tp=-p; fi
# $fifos: paths without blanks (spread_lease.sh refuses a directory with any).
# shellcheck disable=SC2086
if [ "$mode" = send ]; then
  # DIR/drain (podman): a save cut short runs to its end into /dev/null, in
  # a session of its own behind a `tee -p` that goes on once the fan's tee
  # is gone (remote/spread_send.sh says why).
  if [ -s "$dir/drain" ] && [ -n "$tp" ] && command -v setsid >/dev/null 2>&1; then
    { setsid "$@" | setsid tee -p /dev/null | tee $tp $fifos >/dev/null; } &
  else
    { "$@" | tee $tp $fifos >/dev/null; } &
  fi
  child=$!
  # The seed's fan is cvs's own command: when cvs's channel closes (cvs let
  # go, or died) its stdin ends, and so does the whole stream.
  { cat >/dev/null; kill -TERM $$; } <&4 &
else
  # A background job's stdin is /dev/null unless redirected. The tee is a
  # process of its own whose pid the lease reads: its read count is the
  # bytes received (progress), and the lease's `cut` ends this fan.
  printf '%s\n' "$$" >"$dir/fan.pid"
  mkfifo "$dir/f.in" || exit 1
  "$@" <"$dir/f.in" >&2 &
  child=$!
  tee $tp $fifos <&4 >"$dir/f.in" &
  feed=$!
  printf '%s\n' "$feed" >"$dir/tee.pid.new" && mv -f "$dir/tee.pid.new" "$dir/tee.pid"
fi
exec 4<&-
wait "$child"
rc=$?
for p in $pids; do
  wait "${p#*:}"
  printf '@@cvs:kid %s %s\n' "${p%%:*}" "$?" >&2
done
# The stdin watcher (and anything else of this group) goes with the fan.
trap '' TERM
kill -TERM 0 2>/dev/null
exit "$rc"
