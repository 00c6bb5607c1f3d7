# Free bytes in the directory the container runtime unpacks images into: a
# spread names a host short of space before any byte moves to it.
#
#   spread_space.sh RUNTIME… info -f FORMAT
#
# Prints one number (bytes); exit 1 when the runtime or df does not answer.
dir=$("$@") || exit 1
[ -n "$dir" ] || exit 1
df -Pk "$dir" | awk 'NR == 2 { printf "%.0f\n", $4 * 1024 }'
