# The probe: one round trip, what is on the host now (libs access.sh,
# capacity.sh, listen.sh and records.sh prepended). Facts only; the plan decides.
#
#   probe.sh NAME IMAGE PORT MARKER CHECK HOLDERS_FILTER HOLDERS_FORMAT \
#            [GPUS_WHEN GPUS GPU_ROOT GPU_MARKER [RUNTIME [OCI_WHEN [VERSION_WHEN]]]]
#
#   NAME    the container; IMAGE the image as `docker inspect` names it, or
#           empty (docker access and the container only)
#   PORT    the in-container sshd's port (decimal); MARKER the provisioning
#           marker's path inside the container
#   CHECK   the in-container check program (check.sh), for the fallback
#   HOLDERS_FILTER, HOLDERS_FORMAT  `docker ps` filter and format naming the
#           cvs containers holding PORT on the host; empty filter: no port
#           check (only an sshd on the host's network shares the port)
#   GPUS_WHEN  when to list the host's GPUs (program GPUS, gpus.sh, with
#           GPU_ROOT and GPU_MARKER): "always" (every host launches), "stopped"
#           (only where the container does not run: never on the attach
#           path), or empty (no GPU request)
#   RUNTIME "" (docker), --podman or --podman-rootless (lib access.sh): podman
#           answers the inspect through podman_inspect (lib podman.sh), and
#           a rootless probe adds the host's cgroup facts (lib cgroup.sh)
#   OCI_WHEN  rootless podman with devices: when to ask podman which OCI
#           runtime it runs (crun keeps the login user's groups; runc
#           cannot): "always", "stopped" or empty, as GPUS_WHEN
#   VERSION_WHEN  a runtime whose CDI depends on its version (docker), GPUs
#           through CDI asked for: when to ask the daemon's version
#           ("always", "stopped" or empty, as GPUS_WHEN)
#
# On the host it:
# 1. decides docker access: `docker inspect` works -> direct; else with
#    `sudo -n docker` -> sudo; else none (both errors reported). The socket's
#    permissions say which to try first, so no `docker version` is spent;
# 2. with that prefix: one `docker inspect NAME IMAGE` (container and image
#    together);
# 3. when the container exists, learns the rest from the host, without
#    entering it (docs/design.md, "What an attach costs"): sshd liveness from
#    the container's own socket table (/proc/PID/net, PID from the inspect),
#    the provisioning and adoption records (records.sh). Only when that is not
#    possible does it fall back to one `docker exec NAME sh -c CHECK` (or
#    `docker cp NAME:MARKER -` on a stopped container), and then writes the
#    record so that the next probe does not need it.
#
# So on the attach path it spawns one docker process and no other.
#
# Output (parsed by orchestrator/remote/frames.py): line frames
# `@@cvs:TAG WORDS…` built only from checked words; the inspect as a raw
# section whose every line is prefixed (`J` an object's JSON, `E` a line of
# stderr); other command output as encoded sections (b64, or hex from od
# where there is no base64); `@@cvs:done` last, so a truncated probe is told
# from a finished one.
name=$1 image=$2 port=$3 marker=$4 check=$5 holders_filter=$6 holders_format=$7
gpus_when=${8:-} gpus=${9:-} gpu_root=${10:-} gpu_marker=${11:-}
cvs_runtime "${12:-}"
oci_when=${13:-}
version_when=${14:-}
port_hex=$(printf '%04X' "$port")

umask 077
# The temporary directory is made only when a section needs one: the attach
# path does not (see inspect_via).
tmp=
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
trap 'exit 130' HUP INT TERM
if command -v base64 >/dev/null 2>&1; then
  enc=b64
  encode() { base64 <"$1"; }
else
  enc=hex
  encode() { od -An -v -tx1 <"$1"; }
fi
emit() {
  printf '@@cvs:section %s %s %s\n' "$1" "$2" "$enc"
  encode "$tmp/out"
  printf '@@cvs:stderr\n'
  [ -s "$tmp/err" ] && encode "$tmp/err"
  printf '@@cvs:end %s\n' "$1"
}
# section NAME COMMAND…: run COMMAND, its output as the encoded section NAME.
section() {
  if [ -z "$tmp" ]; then
    tmp=$(mktemp -d 2>/dev/null) || { tmp=/tmp/cvs-probe.$$; mkdir -m 700 "$tmp" || exit 90; }
  fi
  _name=$1
  shift
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null 9<&-
  _rc=$?
  emit "$_name" "$_rc"
  return "$_rc"
}
printf '@@cvs:probe 3\n'
cvs_runtime_frame

# Which docker to try first (access.sh): the socket's permissions say whether
# plain `docker` can work, without spending a docker process to find out.
cvs_docker_order

# One `docker inspect` gives the parser each object's JSON and the shell the
# container's ID, init PID and whether it runs, with no process to pick them
# out: a facts line (F) for an object that has a State, then the object on one
# line (J). `index` because a template meets images too (no State there).
# shellcheck disable=SC2016  # a Go template, not shell
format='{{if index . "State"}}F {{index . "Id"}} {{.State.Pid}} {{.State.Running}}{{println}}{{end}}J {{json .}}'

# inspect_via MODE DOCKER…: the raw section "inspect.MODE", built with
# builtins from the captured output (no temporary file, no encoder). Every
# line is prefixed, J (an object) or E (anything else: stderr), so no output
# can forge a frame; the first F line is kept in $_f. Succeeds when docker
# answered (what it did not find is absent).
inspect_via() {
  _m=$1
  shift
  _out=$(cvs_inspect "$name" "$image" "$format" -- "$@" 2>&1 </dev/null 9<&-)
  _rc=$? _f='' _nosuch=''
  printf '@@cvs:section inspect.%s %s raw\n' "$_m" "$_rc"
  _ifs=$IFS
  IFS='
'
  set -f
  for _l in $_out; do
    case $_l in
      'J '*) printf '%s\n' "$_l" ;;
      'F '*) [ -n "$_f" ] || _f=$_l ;;
      *)
        printf 'E %s\n' "$_l"
        case $_l in 'Error: No such object: '*) _nosuch=1 ;; esac ;;
    esac
  done
  set +f
  IFS=$_ifs
  printf '@@cvs:end inspect.%s\n' "$_m"
  [ "$_rc" -eq 0 ] || [ -n "$_nosuch" ]
}

printf '@@cvs:args %s\n' "$name${image:+ $image}"

cvs_capacity /sys/devices/system/cpu/online /proc/meminfo

# The docker prefix lives in "$@" from here on: each docker call is
# `"$@" ARGS…` and nothing from a host or a file is ever unquoted.
via=
# shellcheck disable=SC2154  # cvs_order: set by cvs_docker_order
for m in $cvs_order; do
  if [ "$m" = direct ]; then set -- "$cvs_rt"; else set -- sudo -n "$cvs_rt"; fi
  if inspect_via "$m" "$@"; then
    via=$m
    break
  fi
done
if [ -z "$via" ]; then
  # No access: is the other runtime here (the cluster may name the wrong one)?
  cvs_other_runtime
  # shellcheck disable=SC2154  # cvs_other: set by cvs_other_runtime (access.sh)
  if command -v "$cvs_other" >/dev/null 2>&1; then printf '@@cvs:other %s\n' "$cvs_other"; fi
  printf '@@cvs:done\n'
  exit 0
fi

# The facts from the F line, each checked for its shape before any use.
cid='' pid='' running=''
_facts() { cid=$2 pid=$3 running=$4; }
if [ -n "$_f" ]; then
  set -f
  _ifs=$IFS
  IFS=' '
  # shellcheck disable=SC2086  # split on purpose: the F line's words
  _facts $_f
  IFS=$_ifs
  set +f
fi
cvs_is_id "$cid" || cid=
case $pid in '' | 0 | *[!0-9]*) pid= ;; esac
[ "$running" = true ] || running=
printf '@@cvs:facts %s %s %s\n' "${cid:--}" "${pid:--}" "${running:-no}"
rec=
if [ -n "$cid" ] && cvs_records_read "$cid"; then rec=1; fi

# The GPUs, for the plan to select from, on hosts that will launch.
if [ "$gpus_when" = always ] || { [ "$gpus_when" = stopped ] && [ -z "$running" ]; }; then
  section gpus sh -c "$gpus" cvs-gpus "$gpu_root" "$gpu_marker"
fi
# Rootless podman that will launch a container with devices: its OCI runtime.
if [ -n "$cvs_rootless" ] &&
    { [ "$oci_when" = always ] || { [ "$oci_when" = stopped ] && [ -z "$running" ]; }; }; then
  # shellcheck disable=SC2016  # a Go template, not shell
  section oci_runtime "$@" info --format '{{.Host.OCIRuntime.Name}}'
fi
# GPUs through CDI on a runtime that learned CDI in some version: that version.
if [ "$version_when" = always ] || { [ "$version_when" = stopped ] && [ -z "$running" ]; }; then
  # shellcheck disable=SC2016  # a Go template, not shell
  section version "$@" version --format '{{.Server.Version}}'
fi

if [ -n "$running" ]; then
  # The PID is docker's, in dockerd's PID namespace: only when /proc/PID is
  # that container here (its cgroup path holds the container ID) is its socket
  # table read; otherwise (a login in another PID namespace, the PID gone and
  # reused) the in-container check answers instead.
  listen=
  if [ -n "$pid" ] && [ -n "$cid" ] &&
      IFS= read -r _cg 2>/dev/null <"/proc/$pid/cgroup" &&
      case $_cg in *"$cid"*) true ;; *) false ;; esac; then
    cvs_listening "/proc/$pid/net" "$port_hex"
    case $? in
      0) listen=yes ;;
      1) listen=no ;;
    esac
    [ -z "$listen" ] || printf '@@cvs:listen %s %s\n' "$cid" "$listen"
  fi
  if [ -z "$rec" ] || [ -z "$listen" ]; then
    if section exec "$@" exec "$name" sh -c "$check" cvs-check "$port_hex" "$marker"; then
      # The marker found inside: record it, so the next probe needs no exec.
      if [ -n "$cid" ]; then
        { read -r _; read -r _ _m2; read -r _sha _; } <"$tmp/out"
        if [ "$_m2" = present ] && cvs_is_id "$_sha"; then
          cvs_record_write provisioned "$cid" "$_sha"
        fi
      fi
    else
      section marker_tar "$@" cp "$name:$marker" -
    fi
  fi
else
  if [ -z "$rec" ] && [ -n "$_f" ]; then
    section marker_tar "$@" cp "$name:$marker" -
  fi
  if [ -n "$holders_filter" ]; then
    # Our container does not run and would share the host's network: is its
    # sshd port taken there, and by which cvs container. `docker ps` runs only
    # when the port is taken, so never on the attach path.
    cvs_listening /proc/net "$port_hex"
    case $? in
      0) printf '@@cvs:port yes\n'
        section port_holders "$@" ps --filter "$holders_filter" --format "$holders_format" ;;
      1) printf '@@cvs:port no\n' ;;
      *) printf '@@cvs:port unknown\n' ;;
    esac
  fi
fi
printf '@@cvs:done\n'
