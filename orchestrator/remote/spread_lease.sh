# The direct hop of an image spread (containers/spread.py, transport
# `direct`): what one host holds while its peers send it the image over
# their own ssh, held by this shell until its stdin closes.
#
#   spread_lease.sh ID LIMIT
#
# ID names this invocation (it tags the authorized_keys line); LIMIT bounds
# the lease in seconds whatever happens to the coordinator (a silent
# network). A private directory (0700) is made under TMPDIR. Lines on stdin:
#
#   w NAME TEXT   append TEXT to DIR/NAME (NAME: [a-z0-9_.]+; 0600)
#   auth FROM     add to ~/.ssh/authorized_keys the key in DIR/pub, usable
#                 only from address FROM, only to run DIR/fan.sh (restrict:
#                 no pty, no forwarding), tagged cvs-spread-ID
#   go            print `@@cvs:ready DIR USER`
#   sync          print `@@cvs:synced`
#   watch         (a receiver) once a second, `@@cvs:bytes N` when the bytes
#                 received so far (the read count of the fan's tee, from
#                 /proc/PID/io) changed, `@@cvs:end` once that tee is gone;
#                 nothing where /proc/PID/io cannot be read
#   cut           (a receiver) TERM to the fan (DIR/fan.pid), which ends its
#                 process group: its load reads a cut archive and tags
#                 nothing, its own children's streams end
#
# When stdin closes (the coordinator let go, or died: its connection
# closed), on TERM, HUP or INT, or after LIMIT seconds, the line added is
# removed (only that line, by its tag; the file rewritten whole and renamed
# over, its mode kept), the directory (keys, known_hosts, fifos) with it,
# and the process group ends (the watcher).
id=$1 limit=$2
case $id in *[!A-Za-z0-9-]* | '') echo '@@cvs:error bad id'; exit 2 ;; esac
umask 077
dir=$(mktemp -d "${TMPDIR:-/tmp}/cvs-spread.XXXXXXXX") || exit 1
case $dir in *[!A-Za-z0-9/._-]*) rm -rf "$dir"; echo '@@cvs:error bad dir'; exit 2 ;; esac
keys=$HOME/.ssh/authorized_keys
tag="cvs-spread-$id-$$"
added=no
edit() {
  # $1: the line to add, or empty to remove ours. Under a lock on $HOME
  # (flock, where there is one; no lock file to leave behind): other
  # invocations, or hosts sharing this home, edit it too.
  (
    if command -v flock >/dev/null 2>&1; then
      exec 9<"$HOME" && flock -w 20 9
    fi
    made=$HOME/.ssh/.cvs-spread-created
    if [ ! -d "$HOME/.ssh" ]; then
      mkdir -m 700 "$HOME/.ssh" || exit 1
      echo dir >>"$made"
    fi
    tmp="$keys.cvs-$$"
    if [ -f "$keys" ]; then
      cp -p "$keys" "$tmp" || exit 1
      grep -v -F -e " $tag" "$keys" >"$tmp"
    else
      : >"$tmp"
      echo file >>"$made"
    fi
    [ -n "$1" ] && printf '%s\n' "$1" >>"$tmp"
    if [ ! -s "$tmp" ] && [ -f "$made" ]; then
      # The file was cvs's own: it goes, as does ~/.ssh if cvs made it.
      rm -f "$tmp" "$keys"
      if grep -q dir "$made"; then
        rm -f "$made"
        rmdir "$HOME/.ssh" 2>/dev/null
      fi
      rm -f "$made"
      exit 0
    fi
    mv -f "$tmp" "$keys"
  )
}
cleanup() {
  trap '' TERM HUP INT
  [ "$added" = yes ] && edit ''
  rm -rf "$dir"
  kill -TERM 0 2>/dev/null
}
trap 'cleanup; exit 0' EXIT
trap 'exit 1' TERM HUP INT
# A word to a coordinator that is gone must not kill this shell before it
# cleans up (SIGPIPE ends a shell without its EXIT trap).
trap '' PIPE
# The bound: TERM to this shell after LIMIT seconds, whatever stdin does.
(sleep "$limit" && kill -TERM $$) &
while IFS= read -r line; do
  case $line in
    'w '*)
      rest=${line#w }
      name=${rest%% *}
      case $name in *[!a-z0-9_.]* | '' | .*) echo '@@cvs:error bad name'; exit 2 ;; esac
      printf '%s\n' "${rest#"$name"}" | sed 's/^ //' >>"$dir/$name"
      ;;
    'auth '*)
      from=${line#auth }
      case $from in *[!A-Za-z0-9.:_-]* | '') echo '@@cvs:error bad from'; exit 2 ;; esac
      pub=$(cat "$dir/pub")
      added=yes
      edit "from=\"$from\",restrict,command=\"sh $dir/fan.sh $dir\" $pub $tag" || {
        echo '@@cvs:error authorized_keys not written'
        exit 1
      }
      ;;
    go) printf '@@cvs:ready %s %s\n' "$dir" "$(id -un)" ;;
    sync) echo '@@cvs:synced' ;;
    watch)
      (
        last=''
        while :; do
          if [ -s "$dir/tee.pid" ]; then
            pid=$(cat "$dir/tee.pid")
            # Gone, or a zombie not yet reaped: the stream has ended.
            state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)
            case $state in '' | Z | X) echo '@@cvs:end'; break ;; esac
            n=$(awk '$1 == "rchar:" { print $2 }' "/proc/$pid/io" 2>/dev/null)
            [ -n "$n" ] || break
            [ "$n" = "$last" ] || echo "@@cvs:bytes $n"
            last=$n
          fi
          sleep 1
        done
      ) &
      ;;
    cut)
      pid=$(cat "$dir/fan.pid" 2>/dev/null)
      case $pid in '' | *[!0-9]*) ;; *) kill -TERM "$pid" 2>/dev/null ;; esac
      ;;
    *) echo '@@cvs:error bad line'; exit 2 ;;
  esac
done
