# Library: `cvs_iface ADDRESS` prints the network interface on this machine
# that holds ADDRESS (a host name is resolved first), or nothing. With `ip`
# (iproute2) when the image has it; else, for IPv4, the directly connected
# route in /proc/net/route that covers the address (longest mask), which
# needs only awk. Used where the container shares the host's network.
cvs_iface() {
  cvs_a=$1
  case "$cvs_a" in
    *:* | [0-9]*.[0-9]*.[0-9]*.[0-9]*) ;;
    *) cvs_a=$(getent ahosts "$cvs_a" 2>/dev/null | awk 'NR == 1 { print $1 }') ;;
  esac
  [ -n "$cvs_a" ] || return 0
  if command -v ip >/dev/null 2>&1; then
    ip -o addr show 2>/dev/null | awk -v a="$cvs_a" '
      { split($4, p, "/"); if (p[1] == a) { sub(/@.*/, "", $2); print $2; exit } }'
    return 0
  fi
  case "$cvs_a" in *:*) return 0 ;; esac
  [ -r /proc/net/route ] || return 0
  awk -v a="$cvs_a" '
    function hex(h,   i, v) {
      v = 0
      for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789ABCDEF", substr(toupper(h), i, 1)) - 1
      return v
    }
    BEGIN { split(a, o, "."); best = -1 }
    NR > 1 && $3 == "00000000" && $8 != "00000000" {
      ok = 1; bits = 0
      for (i = 1; i <= 4; i++) {
        d = hex(substr($2, 9 - 2 * i, 2)); m = hex(substr($8, 9 - 2 * i, 2))
        if (o[i] - o[i] % (256 - m) != d) ok = 0
        bits += m
      }
      if (ok && bits > best) { best = bits; name = $1 }
    }
    END { if (best >= 0) print name }' /proc/net/route
}
