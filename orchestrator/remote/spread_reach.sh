# Can this host reach these peers' sshd (containers/spread.py, before a
# direct spread), and with which host key?
#
#   spread_reach.sh TIMEOUT ADDRESS PORT [ADDRESS PORT…]
#
# For each: `@@cvs:key ADDRESS PORT TYPE KEY` for every host key its sshd
# shows (ssh-keyscan, bounded by TIMEOUT), or `@@cvs:unreachable ADDRESS
# PORT` when none answered. Run on a receiver for its own address, it gives
# the key its own sshd shows: the coordinator accepts a feeder's scan only
# when it matches that.
t=$1
shift
while [ $# -ge 2 ]; do
  found=no
  for line in $(ssh-keyscan -T "$t" -p "$2" "$1" 2>/dev/null | awk '!/^#/ && NF >= 3 { print $2 "," $3 }'); do
    printf '@@cvs:key %s %s %s %s\n' "$1" "$2" "${line%%,*}" "${line#*,}"
    found=yes
  done
  [ "$found" = yes ] || printf '@@cvs:unreachable %s %s\n' "$1" "$2"
  shift 2
done
