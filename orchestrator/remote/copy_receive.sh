# The receiving side of `cvs cp` (in the container, or on the host).
#
#   copy_receive.sh DEST NAME file|dir MODE SHA256     (stdin: the bytes)
#
# Lands where `cp -r` would put it: inside DEST when DEST is a directory (or
# ends with /), else as DEST. A file is checked against SHA256 before it takes
# its name, so an interrupted or corrupted copy never replaces DEST; then the
# final path (`@@cvs-final:PATH`) and the sha256 of every file written.
set -e
dest=$1 name=$2 kind=$3 mode=$4 want=$5
case $dest in */) mkdir -p -- "$dest" ;; esac
if [ -d "$dest" ]; then final=${dest%/}/$name; else final=$dest; fi
parent=$(dirname -- "$final")
mkdir -p -- "$parent"
if [ "$kind" = dir ]; then
  mkdir -p -- "$final"
  tar -x -o -f - -C "$final"
  echo "@@cvs-final:$final"
  cd -- "$final"
  find . -type f -exec sha256sum {} +
else
  tmp="$parent/.cvs-cp.$$"
  trap 'rm -f -- "$tmp"' EXIT
  cat >"$tmp"
  got=$(sha256sum <"$tmp")
  got=${got%% *}
  if [ "$got" != "$want" ]; then
    echo "$final: not replaced: what arrived has sha256 $got (incomplete?)" >&2
    exit 1
  fi
  chmod "$mode" "$tmp"
  mv -f -- "$tmp" "$final"
  echo "@@cvs-final:$final"
  sha256sum <"$final"
fi
