# Inside the container, as root: stop what `cvs exec` started there.
#
#   kill_tree.sh PIDFILE
#   kill_tree.sh --session PREFIX
#
# `docker exec` has no way to stop what it started (killing the client leaves
# the process running), so the command's shell recorded its pid in PIDFILE.
# With --session, every command of one invocation: the PIDFILEs named
# /tmp/.cvs-exec-PREFIX*.pid (the lock holder of an invocation that went
# without a word runs this: remote/lock.sh's guard).
# Descendants are found from /proc/*/status (no pgrep/ps: minimal images lack
# them), read once per walk: the pid -> parent table, then the tree from it.
# KILL goes to the first walk's pids too: once TERM has ended the recording
# shell, a command that ignored TERM is no longer its descendant. Prints
# `ended PIDFILE` for each command it ended (nothing when none was left).
# tree ROOT: ROOT and its descendants, one walk of /proc.
tree() {
  _table=''
  for d in /proc/[0-9]*; do
    pp=''
    while read -r k v; do [ "$k" = PPid: ] && { pp=$v; break; }; done <"$d/status" 2>/dev/null
    [ -n "$pp" ] && _table="$_table${d#/proc/} $pp
"
  done
  found=" $1 " more=1
  while [ -n "$more" ]; do
    more=''
    while read -r pid pp; do
      case $found in
        *" $pp "*) case $found in *" $pid "*) ;; *) found="$found$pid " more=1 ;; esac ;;
      esac
    done <<EOF_TABLE
$_table
EOF_TABLE
  done
  echo "$found"
}
# end PIDFILE: TERM the tree, then KILL what is left.
end() {
  p=$(cat "$1" 2>/dev/null) || return 0
  case $p in '' | *[!0-9]*) return 0 ;; esac
  # The pid must still be the shell that wrote PIDFILE (its argv names it): a
  # container restarted since may have given it to another process. Then
  # nothing is killed and PIDFILE stays (the evidence containers/causes.py
  # reads). $(…) drops the NUL separators: a substring is enough.
  case $(cat "/proc/$p/cmdline" 2>/dev/null) in
    *"$1"*) ;;
    *) return 0 ;;
  esac
  pids=$(tree "$p")
  # shellcheck disable=SC2086  # a list of pids, split on purpose
  kill -TERM $pids 2>/dev/null
  sleep 0.3
  # shellcheck disable=SC2046,SC2086  # lists of pids, split on purpose
  kill -KILL $pids $(tree "$p") 2>/dev/null
  rm -f "$1"
  echo "ended $1"
}
if [ "$1" = --session ]; then
  case $2 in '' | *[!0-9a-f]*) exit 2 ;; esac
  for f in /tmp/.cvs-exec-"$2"*.pid; do
    [ -e "$f" ] && end "$f"
  done
else
  end "$1"
fi
true
