# Library (prepended to a program, never run alone): is anything listening on
# a TCP port, read from a network namespace's socket table. The one place cvs
# decides "sshd listens" (the probe, from the host and inside the container;
# the sshd installer; the host-network port check).
#
# cvs_listening NETDIR PORT_HEX
#   NETDIR: /proc/net, or /proc/PID/net for another process's namespace.
#   PORT_HEX: the port as the table prints it, 4 upper-case hex digits.
#   Exit 0 listening, 1 not, 2 unknown (no readable table).
#
# IPv4 (NETDIR/tcp) when the namespace has it, IPv6 (NETDIR/tcp6) only when it
# has no IPv4 table: peers dial the cluster's IPv4 addresses, and an sshd whose
# IPv4 port was taken binds its IPv6 socket alone and refuses them.
#
# Builtins only, and the table is read only as far as its listeners: Linux
# prints listening sockets first (tcp_get_idx), and producing the rest walks
# the kernel's whole established-connection hash table (262144 buckets here,
# more on big hosts), which made one `grep` of the file cost 5 ms of CPU.
# `read` takes a byte at a time, so the kernel formats no line past the one
# that ends the loop.
cvs_listening() {
  _cvs_t=$1/tcp
  [ -r "$_cvs_t" ] || _cvs_t=$1/tcp6
  [ -r "$_cvs_t" ] || return 2
  while read -r _ _cvs_loc _ _cvs_st _; do
    case $_cvs_st in
      0A) case $_cvs_loc in *:"$2") return 0 ;; esac ;;
      st) ;;
      *) return 1 ;;
    esac
  done <"$_cvs_t"
  return 1
}
