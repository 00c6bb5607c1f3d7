# The sending side of `cvs cp --gather`: the file's sha256 on stderr, its
# bytes on stdout.
#   copy_send.sh PATH
[ -f "$1" ] || { echo "$1: not a regular file" >&2; exit 66; }
sha256sum <"$1" >&2
exec cat -- "$1"
