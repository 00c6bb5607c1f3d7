# Free bytes in the directory the container runtime unpacks images into: a
# spread names a host short of space before any byte moves to it.
#
#   spread_space.sh RUNTIME… info -f FORMAT
#
# Prints one number (bytes); nothing when the runtime or df does not
# answer. A directory the login user may not look into (a rootful
# runtime's, under a closed parent) is read through its nearest parent that
# df can read: the same filesystem unless the root is a mount of its own.
dir=$("$@") || exit 1
while [ -n "$dir" ]; do
  free=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }')
  if [ -n "$free" ]; then
    printf '%s\n' "$free"
    exit 0
  fi
  dir=${dir%/*}
done
df -Pk / | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }'
