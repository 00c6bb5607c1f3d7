# The receiving side of `cvs cp` (in the container, or on the host).
#
#   copy_receive.sh DEST NAME file|dir MODE SHA256     (stdin: the bytes)
#
# Lands where `cp -r` would put it: inside DEST when DEST is a directory (or
# ends with /), else as DEST. Nothing takes a final name before it is whole:
# a file goes to a temp name in its final directory, is checked against
# SHA256, then renamed. A directory's tar (containers/copy.py: the tree under
# `./d/`, then `./sha256`, the manifest, last) goes to a staging directory
# next to its final place; only when the manifest arrived (the stream was not
# cut) and every file matches it does each file move, through a temp name in
# its final directory, to its final name. Then the final path
# (`@@cvs-final:PATH`) and the sha256 of every file written.
#
# Temp names go on every exit: error, the channel closing under us (cvs
# killed or interrupted: stdin ends early, a write raises SIGPIPE), a signal.
# The traps turn each signal into an exit, whose trap removes them (a shell
# killed by an untrapped signal runs no EXIT trap).
set -e
dest=$1 name=$2 kind=$3 mode=$4 want=$5
tmp='' stage='' moving=''
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [ -n "$tmp" ]; then rm -f -- "$tmp"; fi
  if [ -n "$moving" ]; then rm -f -- "$moving"; fi
  if [ -n "$stage" ]; then rm -rf -- "$stage"; fi
}
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 141' PIPE
case $dest in */) mkdir -p -- "$dest" ;; esac
if [ -d "$dest" ]; then final=${dest%/}/$name; else final=$dest; fi
parent=$(dirname -- "$final")
mkdir -p -- "$parent"
if [ "$kind" = dir ]; then
  stage="$parent/.cvs-cp.$$.d"
  mkdir -- "$stage"
  tar -x -o -f - -C "$stage"
  if [ ! -f "$stage/sha256" ] || [ ! -d "$stage/d" ]; then
    echo "$final: not replaced: the archive arrived incomplete" >&2
    exit 1
  fi
  (cd -- "$stage/d" && find . -type f -exec sha256sum {} +) >"$stage/got"
  # Names are unique on each side: a line seen once is a file that differs,
  # is missing, or is extra.
  odd=$(sort -- "$stage/got" "$stage/sha256" | uniq -u | head -n 1)
  if [ -n "$odd" ]; then
    echo "$final: not replaced: what arrived differs from what was sent (${odd#*  })" >&2
    exit 1
  fi
  (cd -- "$stage/d" && find . -type d) >"$stage/dirs"
  (cd -- "$stage/d" && find . ! -type d) >"$stage/files"
  mkdir -p -- "$final"
  while IFS= read -r d; do mkdir -p -- "$final/$d"; done <"$stage/dirs"
  while IFS= read -r f; do
    t="$final/${f#./}"
    # Through a temp name in the final directory: when the staging directory
    # is on another filesystem, mv copies, and the copy must not be seen.
    moving="${t%/*}/.cvs-cp.$$"
    mv -f -- "$stage/d/$f" "$moving"
    mv -f -- "$moving" "$t"
    moving=''
  done <"$stage/files"
  # Directory modes as sent, once their files are in (as tar does).
  while IFS= read -r d; do
    if [ "$d" != . ] && m=$(stat -c %a -- "$stage/d/$d" 2>/dev/null); then
      chmod "$m" "$final/$d"
    fi
  done <"$stage/dirs"
  echo "@@cvs-final:$final"
  cat -- "$stage/got"
else
  tmp="$parent/.cvs-cp.$$"
  cat >"$tmp"
  got=$(sha256sum <"$tmp")
  got=${got%% *}
  if [ "$got" != "$want" ]; then
    echo "$final: not replaced: what arrived has sha256 $got (incomplete?)" >&2
    exit 1
  fi
  chmod "$mode" "$tmp"
  mv -f -- "$tmp" "$final"
  tmp=''
  echo "@@cvs-final:$final"
  sha256sum <"$final"
fi
