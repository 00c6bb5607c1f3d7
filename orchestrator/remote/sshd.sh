# Inside the container, as root (lib listen.sh prepended): install the
# cluster's ssh files and make sure its sshd runs and listens.
#
#   sshd.sh PORT HOSTFILE PIDFILE CONFIG HOST_KEY KEY_NAME KNOWN_HOSTS_NAME LOGIN [ADDRESS]
#
# ADDRESS, the host's inter-host address (vpc_address, else address): its
# interface (lib iface.sh) goes into Open MPI's per-user parameter file,
# ~/.openmpi/mca-params.conf (btl_tcp_if_include, oob_tcp_if_include), for
# root and LOGIN, unless that file exists and is not ours. OMPI_MCA_*
# variables and `mpirun --mca` override it (docs/mpi.md). Prints
# `mpi-interface NAME` when it wrote one.
#
# The files arrive framed on stdin (provision.frame_files): `@@cvs-file NAME`,
# base64 lines, `@@cvs-end` per file, then `@@cvs-done`. LOGIN is the user
# commands run as (container.user, else the image's USER; may be empty: root).
# sshd is left alone if its pidfile names a live sshd AND it listens on PORT
# (cvs_listening; no `pgrep -f` that could match the check itself) AND the
# host key and config installed are the ones it has; otherwise
# it is (re)started and must be listening within 5 s. Prints `sshd: started`
# or `sshd: already running`, and `sshd-pid N`. The exit codes are mirrored by
# orchestrator/containers/provision.py (a test compares them).
EXIT_MISSING_TOOL=90      # base64 missing in the image
EXIT_BAD_PAYLOAD=91       # frames incomplete or undecodable
EXIT_NO_SSHD=94           # /usr/sbin/sshd missing
EXIT_SSHD_START=95        # sshd exited with an error on start
EXIT_SSHD_NOT_LISTENING=96 # sshd started but does not listen on the port
EXIT_INSTALL=97           # writing the sshd / ssh files failed
# The frames the payload must hold (provision.SSHD_FILES).
FILES="host_key user_key user_key_pub authorized_keys known_hosts ssh_config sshd_config hostfile"

port=$1 hostfile=$2 pidfile=$3 config=$4 host_key=$5 key_name=$6 known_hosts=$7
login=${8%%:*}
address=${9:-}
port_hex=$(printf '%04X' "$port")
umask 077
fail() {
  code=$1
  shift
  echo "cvs: $*" >&2
  exit "$code"
}
command -v base64 >/dev/null 2>&1 ||
  fail $EXIT_MISSING_TOOL "the container image lacks: base64 (needed to receive the sshd files)"
[ -x /usr/sbin/sshd ] || fail $EXIT_NO_SSHD \
  "image has no sshd (/usr/sbin/sshd): use an image with openssh-server or the default setup script"
dir=$(mktemp -d 2>/dev/null) || { dir=/tmp/cvs-sshd.$$; mkdir "$dir" || exit $EXIT_INSTALL; }
trap 'rm -rf "$dir"' EXIT
cur='' done=''
while IFS= read -r line; do
  case "$line" in
    '@@cvs-file '*)
      cur=${line#@@cvs-file }
      case "$cur" in '' | *[!a-z_]*) fail $EXIT_BAD_PAYLOAD "bad frame name" ;; esac
      : >"$dir/$cur.b64" ;;
    '@@cvs-end')
      [ -n "$cur" ] || fail $EXIT_BAD_PAYLOAD "frame end without a file"
      base64 -d <"$dir/$cur.b64" >"$dir/$cur" || fail $EXIT_BAD_PAYLOAD "undecodable $cur"
      cur='' ;;
    '@@cvs-done')
      done=1
      break ;;
    *) [ -n "$cur" ] && printf '%s\n' "$line" >>"$dir/$cur.b64" ;;
  esac
done
[ -n "$done" ] || fail $EXIT_BAD_PAYLOAD "truncated sshd payload"
for f in $FILES; do
  [ -f "$dir/$f" ] || fail $EXIT_BAD_PAYLOAD "sshd payload lacks $f"
done
# Who runs commands here: the image's USER (or container.user), root if unset.
user=root uid=0 gid=0 home=/root
if [ -n "$login" ] && [ "$login" != root ] && [ "$login" != 0 ]; then
  found=''
  while IFS=: read -r n _ u g _ h _; do
    if [ "$n" = "$login" ] || [ "$u" = "$login" ]; then
      found=1 user=$n uid=$u gid=$g home=$h
      break
    fi
  done </etc/passwd
  [ -n "$found" ] || fail $EXIT_INSTALL \
    "the container's user $login is not in /etc/passwd: cannot install its ssh files"
fi
put() {
  { mkdir -p "${2%/*}" && cp "$dir/$1" "$2.cvs-tmp" && chmod "$3" "$2.cvs-tmp" &&
    chown "$4" "$2.cvs-tmp" && mv -f "$2.cvs-tmp" "$2"; } ||
    fail $EXIT_INSTALL "could not write $2"
}
# sshd reads its host key and config only when it starts: when either
# differs from what is installed now (someone replaced the key: an impostor,
# which `up --reprovision` undoes), a running sshd is replaced below. No cmp
# in the image: replaced too (never left serving another key).
changed=''
for f in "host_key $host_key" "sshd_config $config"; do
  cmp -s "$dir/${f%% *}" "${f#* }" 2>/dev/null || changed=1
done
put host_key "$host_key" 600 0:0
put sshd_config "$config" 600 0:0
put hostfile "$hostfile" 644 0:0
# The cluster key, known hosts and ssh config for root and, when it is
# someone else, for the image's user: `ssh peer` works as either.
for who in "root 0 0 /root" "$user $uid $gid $home"; do
  # shellcheck disable=SC2086  # four words, split on purpose
  set -- $who
  h=$4 owner=$2:$3
  { [ "$h" = / ] || [ -z "$h" ]; } && continue
  { mkdir -p "$h/.ssh" && chmod 700 "$h/.ssh" && chown "$owner" "$h/.ssh"; } ||
    fail $EXIT_INSTALL "could not create $h/.ssh"
  put user_key "$h/.ssh/$key_name" 600 "$owner"
  put user_key_pub "$h/.ssh/$key_name.pub" 644 "$owner"
  put known_hosts "$h/.ssh/$known_hosts" 644 "$owner"
  put ssh_config "$h/.ssh/config" 600 "$owner"
  # Keep keys the image put there; replace only the orchestrator's own.
  {
    [ -f "$h/.ssh/authorized_keys" ] && grep -v ' cvs-cluster@' "$h/.ssh/authorized_keys"
    cat "$dir/authorized_keys"
  } >"$dir/ak"
  put ak "$h/.ssh/authorized_keys" 600 "$owner"
  [ "$1" = "$user" ] && break
done
# Open MPI's TCP transports on the inter-host network only (never docker0, lo).
iface=''
[ -n "$address" ] && iface=$(cvs_iface "$address")
case "$iface" in *[!A-Za-z0-9_.:-]*) iface='' ;; esac
if [ -n "$iface" ]; then
  {
    echo "# Written by cvs-orchestrator: Open MPI on the inter-host network ($address)."
    echo "# OMPI_MCA_* variables and mpirun --mca override it; see cvs's docs/mpi.md."
    echo "btl_tcp_if_include = $iface"
    echo "oob_tcp_if_include = $iface"
  } >"$dir/mca"
  for who in "root 0 0 /root" "$user $uid $gid $home"; do
    # shellcheck disable=SC2086  # four words, split on purpose
    set -- $who
    h=$4 owner=$2:$3
    { [ "$h" = / ] || [ -z "$h" ]; } && continue
    f="$h/.openmpi/mca-params.conf"
    if [ ! -e "$f" ] || grep -q '^# Written by cvs-orchestrator' "$f"; then
      { mkdir -p "$h/.openmpi" && chown "$owner" "$h/.openmpi"; } ||
        fail $EXIT_INSTALL "could not create $h/.openmpi"
      put mca "$f" 644 "$owner"
    fi
    [ "$1" = "$user" ] && break
  done
  echo "mpi-interface $iface"
fi
# With UsePAM no, sshd refuses any login to a locked account ('!' password).
for who in root "$user"; do
  case "$who" in '' | *[!A-Za-z0-9_.-]*) continue ;; esac
  if [ -w /etc/shadow ] && grep -q "^$who:!" /etc/shadow; then
    sed -i "s/^$who:![^:]*:/$who:*:/" /etc/shadow && echo "sshd: unlocked $who for key-only login"
  fi
done

pid_alive() {
  pid=''
  { [ -r "$pidfile" ] && read -r pid <"$pidfile"; } || return 1
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  # sshd reparents to the container's init, which may not reap: a zombie is dead.
  case "${stat##*) }" in Z* | X*) return 1 ;; esac
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sshd ]
}
nap() { sleep 0.1 2>/dev/null || sleep 1; }

if [ -z "$changed" ] && pid_alive && cvs_listening /proc/net "$port_hex"; then
  echo "sshd: already running"
  echo "sshd-pid $pid"
  exit 0
fi
if pid_alive; then
  # Ours (pidfile) but not on this port (e.g. the port changed), or started
  # with another host key or config: replace it.
  [ -z "$changed" ] || echo "sshd: restarted: its host key or config was not this cluster's"
  kill "$pid" 2>/dev/null
  i=0
  while pid_alive && [ $i -lt 30 ]; do
    nap
    i=$((i + 1))
  done
fi
rm -f "$pidfile"
mkdir -p /run/sshd && chmod 755 /run/sshd
/usr/sbin/sshd -f "$config" -E /var/log/cvs-sshd.log </dev/null
rc=$?
if [ $rc -ne 0 ]; then
  tail -n 5 /var/log/cvs-sshd.log >&2 2>/dev/null
  fail $EXIT_SSHD_START "sshd failed to start (exit $rc); log: /var/log/cvs-sshd.log"
fi
i=0
while [ $i -lt 50 ]; do
  if pid_alive && cvs_listening /proc/net "$port_hex"; then
    echo "sshd: started"
    echo "sshd-pid $pid"
    exit 0
  fi
  nap
  i=$((i + 1))
done
tail -n 5 /var/log/cvs-sshd.log >&2 2>/dev/null
fail $EXIT_SSHD_NOT_LISTENING "sshd started but nothing listens on port $port after 5s"
