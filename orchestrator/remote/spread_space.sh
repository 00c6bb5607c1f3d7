# Free bytes in the directory the container runtime unpacks images into: a
# spread names a host short of space before any byte moves to it.
#
#   spread_space.sh RUNTIME… info -f FORMAT
#
# Prints one number (bytes); nothing when the runtime or df does not
# answer. A directory the login user may not look into (a rootful
# runtime's, under a closed parent) is read through its nearest parent that
# df can read: the same filesystem unless the root is a mount of its own,
# which /proc/self/mountinfo tells (readable by anyone): then nothing is
# printed (not known), never the parent's figure for another disk.
root=$("$@") || exit 1

# The filesystem (major:minor) of the mount that holds path $1: the longest
# mount point that is it or one of its parents. A bind mount of the same
# filesystem (dockerd's data-root often is one) has the same major:minor.
# Nothing without mountinfo (then the parent's figure stands, as before).
mount_of() {
  awk -v p="$1" '{
    mp = $5
    prefix = (mp == "/") ? "/" : mp "/"
    if ((p == mp || index(p, prefix) == 1) && length(mp) >= length(best)) { best = mp; dev = $3 }
  } END { print dev }' /proc/self/mountinfo 2>/dev/null
}

dir=$root
while [ -n "$dir" ]; do
  free=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }')
  if [ -n "$free" ]; then
    if [ "$dir" != "$root" ] && [ "$(mount_of "$root")" != "$(mount_of "$dir")" ]; then
      echo "spread_space: $root is a filesystem of its own that this user cannot read: its free space is not known" >&2
      exit 0
    fi
    printf '%s\n' "$free"
    exit 0
  fi
  dir=${dir%/*}
done
if [ "$(mount_of "$root")" != "$(mount_of /)" ]; then
  echo "spread_space: $root is a filesystem of its own that this user cannot read: its free space is not known" >&2
  exit 0
fi
df -Pk / | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }'
