"""One round trip per host -> HostState (facts only; plan.py decides).

`probe_command` builds one POSIX sh script. On the host it:

1. decides docker access: `docker inspect` works -> direct; else with
   `sudo -n docker` -> sudo; else none (both errors reported). The socket's
   permissions say which to try first, so no `docker version` is spent;
2. with that prefix: one `docker inspect NAME IMAGE` (container and image
   together);
3. when the container exists, learns the rest from the host, without
   entering the container (docs/design.md, "What an attach costs"):
   - sshd liveness from the container's own socket table,
     `/proc/PID/net/tcp` (PID from the inspect: readable by any user, and
     the container's network namespace whatever its network mode). An IPv4
     listener counts: peers dial the cluster's IPv4 addresses, and an sshd
     that bound only its IPv6 socket refuses them;
   - the provisioning record: cvs writes it on the host, keyed by the full
     container ID, when the setup script succeeds (`provision_record_command`).
     A new container is a new ID, so a record can never vouch for a container
     it was not written for;
   - the adoption record (`cvs up --adopt`), keyed the same way.
   Only when that is not possible (no record yet, say a container provisioned
   by another login user, or an unreadable socket table) does it fall back to
   one `docker exec NAME sh -c …` reading the marker and the listener inside
   the container (or `docker cp NAME:MARKER -` on a stopped one), and then
   writes the record so the next probe does not need it.

So on the attach path the probe spawns one docker process and no other:
the inspect's output is captured and framed with shell builtins, and the
socket table is read with `read` (see `_listen_loop` for why that matters).

Facts that are one short line (`args`, `capacity`, `facts`, `adopted`,
`record`, `listen`) come back as line frames, `@@cvs:TAG WORDS…`, built only
from validated words. The inspect comes back as a raw section whose every
line is prefixed, `J` (one object's JSON) or `E` (a line of stderr):

    @@cvs:section inspect.MODE RC raw
    J {...}
    E Error: No such object: ...
    @@cvs:end inspect.MODE

Other command output (the fallbacks) comes back as encoded sections:

    @@cvs:section NAME RC ENC      ENC is b64 (base64) or hex (od, fallback)
    <encoded stdout>
    @@cvs:stderr
    <encoded stderr>                (empty stderr: nothing)
    @@cvs:end NAME
    ...
    @@cvs:done

Prefixing or encoding bodies means no output (labels, error text) can forge a frame, and
the missing `@@cvs:done` tells a truncated probe from a finished one.
`parse_probe_output` turns that into a `HostState`; anything it cannot read
becomes `error` with the container state unknown (None), never "absent".
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from types import MappingProxyType
from typing import Any, Literal

from orchestrator.config import ContainerConfig
from orchestrator.containers.docker import (
    CONTAINER_ID_RE,
    DOCKER_CLI_ENV,
    LABEL_MANAGED,
    LABEL_SSHD_PORT,
    ContainerLimits,
    DockerOutputError,
    classify_docker_error,
    image_inspect_argv,
    parse_container_inspect,
    parse_image_inspect,
    validate_container_name,
)
from orchestrator.containers.runtime import Runtime, RuntimeName, access_order

DockerAccessMode = Literal["direct", "sudo", "none"]
ContainerState = Literal["absent", "running", "exited", "other"]
ErrorKind = Literal["unreachable", "no_docker", "no_access", "daemon_down", "garbled", "docker"]

FRAME = "@@cvs:"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}\b")


@dataclass(frozen=True)
class HostState:
    host: str
    reachable: bool = True
    error: str | None = None  # why the probe could not tell (daemon down, no access, garbled)
    error_kind: ErrorKind | None = None
    docker_access: DockerAccessMode | None = None  # None: could not tell (e.g. daemon down)
    container: ContainerState | None = None  # None = unknown, NEVER treated as absent
    container_status: str | None = None  # docker's word (paused, restarting, created, …)
    container_id: str | None = None
    container_image_id: str | None = None
    container_image_readable: bool = True  # False when the container's image id is unreadable
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    started_at: str | None = None
    host_config: ContainerLimits | None = None  # parsed limits for drift checks
    tag_image_id: str | None = None  # what cfg.image resolves to on this host now (None: absent)
    tag_repo_digests: tuple[str, ...] = ()
    tag_error: str | None = None  # image inspect failed for a reason other than "no such image"
    # --- capacity (issue 15): what the host has, for requests beyond it ---
    cpu_count: int | None = None  # None: not reported
    memory_total: int | None = None  # bytes (MemTotal)
    sshd_listening: bool | None = None  # None: not checked (not running, no /proc/net, exec failed)
    provision_marker: str | None = None  # sha256 of the script that provisioned the container
    exec_error: str | None = None  # why the in-container check could not run
    # network host + sshd wanted, our container not running: is the sshd port
    # taken on the host already (None: not checked), and by which cvs containers
    # ("NAME (cluster IDENTITY)"), so a start is refused before anything runs.
    sshd_port_busy: bool | None = None
    sshd_port_holders: tuple[str, ...] = ()
    # The runtime the probe reached (docker_access says how): the cluster's
    # container.runtime; rootless for the login user's own podman.
    runtime: RuntimeName = "docker"
    rootless: bool = False
    # Rootless only (None elsewhere): "v1" or "v2", and on v2 the controllers
    # the login user's cgroup offers (what rootless podman can cap).
    cgroup: str | None = None
    cgroup_controllers: tuple[str, ...] = ()

    @property
    def runtime_access(self) -> Runtime:
        """How to reach the runtime here; ValueError when the probe found no access."""
        return Runtime.for_access(self.runtime, self.docker_access, rootless=self.rootless)

    @classmethod
    def unreachable(cls, host: str, reason: str) -> HostState:
        return cls(host=host, reachable=False, error=reason, error_kind="unreachable")

    @property
    def known(self) -> bool:
        """Reachable, docker usable, and the container state determined."""
        return (
            self.reachable
            and self.docker_access in ("direct", "sudo")
            and self.container is not None
        )


# --- the script ----------------------------------------------------------

_PRELUDE = r"""
umask 077
DOCKER_CLI_ENV
# The temporary directory is made only when a section needs one: the attach
# path does not (see inspect_via).
tmp=
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
trap 'exit 130' HUP INT TERM
if command -v base64 >/dev/null 2>&1; then
  enc=b64; encode() { base64 < "$1"; }
else
  enc=hex; encode() { od -An -v -tx1 < "$1"; }
fi
emit() {
  printf '@@cvs:section %s %s %s\n' "$1" "$2" "$enc"
  encode "$tmp/out"
  printf '@@cvs:stderr\n'
  [ -s "$tmp/err" ] && encode "$tmp/err"
  printf '@@cvs:end %s\n' "$1"
}
section() {
  if [ -z "$tmp" ]; then
    tmp=$(mktemp -d 2>/dev/null) || { tmp=/tmp/cvs-probe.$$; mkdir -m 700 "$tmp" || exit 90; }
  fi
  _name=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null 9<&-
  _rc=$?
  emit "$_name" "$_rc"
  return "$_rc"
}
printf '@@cvs:probe 2\n'
""".lstrip().replace("DOCKER_CLI_ENV", DOCKER_CLI_ENV)


def _listen_loop(path: str, port: int) -> list[str]:
    """sh lines setting `listen=yes` when the socket table at `path` (shell
    text) has an IPv4 LISTEN line on `port`, else `listen=no`.

    Builtins only, and the table is read only as far as its listeners:
    Linux prints listening sockets first (tcp_get_idx), and producing the
    rest walks the kernel's whole established-connection hash table
    (262144 buckets here, more on big hosts), which made one `grep` of the
    file cost 5 ms of CPU. `read` takes a byte at a time, so the kernel
    formats no line past the one that ends the loop.
    """
    return [
        "listen=no",
        "while read -r _sl _loc _rem _st _rest; do",
        "  case $_st in",
        f"    0A) case $_loc in *:{port:04X}) listen=yes; break ;; esac ;;",
        "    st) ;;",
        "    *) break ;;",
        "  esac",
        f"done <{path}",
    ]


def _listen_script(port: int) -> list[str]:
    """sh lines printing `listen yes|no|unknown`: whether anything LISTENs on
    `port` over IPv4 in this network namespace (from /proc/net/tcp: no
    ss/netstat needed). IPv4, because peers dial IPv4 addresses: an sshd that
    bound only its IPv6 socket (the IPv4 port taken) refuses them."""
    return [
        "listen=unknown",
        "if [ -r /proc/net/tcp ]; then",
        *("  " + line for line in _listen_loop("/proc/net/tcp", port)),
        "fi",
        'echo "listen $listen"',
    ]


def _in_container_script(sshd_port: int, marker_path: str) -> str:
    return "\n".join(
        [
            *_listen_script(sshd_port),
            f"if [ -r {shlex.quote(marker_path)} ]; then",
            "  echo marker present",
            f"  cat {shlex.quote(marker_path)}",
            "else",
            "  echo marker absent",
            "fi",
        ]
    )


# --- capacity (issue 15): the host's online CPUs and MemTotal, from builtins ---
_CAPACITY = r"""
cpus=0
if IFS= read -r _online 2>/dev/null </sys/devices/system/cpu/online; then
  # "0-15" or "0-3,8-11": count them with builtins, no process.
  _ifs=$IFS; IFS=,
  for _r in $_online; do
    _a=${_r%-*} _b=${_r#*-}
    # Plain decimal numbers only (no sign, no leading zero): nothing here
    # can make the arithmetic fail, which would end the shell.
    case $_a.$_b in
      *[!0-9.]*|.*|*.|0[0-9]*|*.0[0-9]*) cpus= ; break ;;
    esac
    [ ${#_a} -le 6 ] && [ ${#_b} -le 6 ] || { cpus= ; break; }
    cpus=$((cpus + _b - _a + 1))
  done
  IFS=$_ifs
else
  cpus=
fi
[ -n "$cpus" ] && [ "$cpus" != 0 ] || cpus=$(nproc 2>/dev/null) || cpus=
mem= _k=
read -r _k mem _u 2>/dev/null </proc/meminfo
[ "$_k" = MemTotal: ] || mem=
case $cpus in ''|*[!0-9]*) cpus=- ;; esac
case $mem in ''|*[!0-9]*) mem=- ;; esac
printf '@@cvs:capacity %s %s\n' "$cpus" "$mem"
""".strip()


def _capacity_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """cpu_count and memory_total from the capacity frame (`CPUS MEMTOTAL_KB`,
    `-` for either when the host did not say); missing: nothing."""
    section = sections.get("capacity")
    if section is None:
        return {}
    words = section.stdout.split()
    if len(words) != 2:
        return {}
    out: dict[str, object] = {}
    if words[0].isdigit() and int(words[0]) > 0:
        out["cpu_count"] = int(words[0])
    if words[1].isdigit():
        out["memory_total"] = int(words[1]) * 1024
    return out


# --- records on the host, keyed by container ID -------------------------------
# Docker cannot relabel a running container, so `cvs up --adopt` records
# ownership on the host: one file per adopted container ID holding the
# cluster's name. The provisioning record is the same idea for the setup
# script's sha256, so an attach learns "provisioned" without a `docker exec`.
# Both live in the login user's state directory; a record whose ID is not the
# container's now is never read (the probe looks up the inspected ID only).
STATE_DIR = "${XDG_STATE_HOME:-$HOME/.local/state}/cvs"
ADOPTED_DIR = f"{STATE_DIR}/adopted"
PROVISIONED_DIR = f"{STATE_DIR}/provisioned"
# Records of containers removed behind cvs's back are pruned when a record is
# written: a record not rewritten for this long is dropped (the probe falls
# back to the in-container marker and writes it again).
RECORD_MAX_AGE_DAYS = 60


def _write_record(container_id: str, sha256: str) -> str:
    """sh text writing one provisioning record (0600, in a 0700 directory).
    Both arguments go inside double quotes: checked hex literals, or `$var`
    naming a value the caller has checked. The one place the record's format
    lives."""
    return (
        f'(umask 077; mkdir -p "{PROVISIONED_DIR}" && '
        f'printf "%s\\n" "{sha256}" > "{PROVISIONED_DIR}/{container_id}") 2>/dev/null'
    )


def provision_record_command(container_id: str, sha256: str) -> str:
    """Host shell text: record that `container_id` was provisioned with the
    script `sha256` (written when the setup script succeeded). Never fails
    the command it follows: a record that cannot be written only costs the
    next probe a `docker exec`."""
    if not CONTAINER_ID_RE.fullmatch(container_id):
        raise ValueError(f"invalid container ID {container_id!r} (64 hex digits)")
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    prune = (
        f'find "{PROVISIONED_DIR}" -type f -mtime +{RECORD_MAX_AGE_DAYS} '
        "-exec rm -f {} + 2>/dev/null"
    )
    return f"{{ {_write_record(container_id, sha256)} && {prune}; }}; true"


def forget_records_command(container_id: str) -> str:
    """Host shell text: drop the records of a container cvs removed."""
    if not CONTAINER_ID_RE.fullmatch(container_id):
        raise ValueError(f"invalid container ID {container_id!r} (64 hex digits)")
    return f"rm -f {_record_paths(container_id)}"


def _record_paths(container_id: str) -> str:
    """Both of a container's record paths, double-quoted (`container_id`: a
    checked ID or `$var`)."""
    return f'"{PROVISIONED_DIR}/{container_id}" "{ADOPTED_DIR}/{container_id}"'


def forget_removed_records_command(ids_var: str = "ids") -> str:
    """Host shell text: drop the records of the containers whose IDs the shell
    variable `ids_var` lists (a removal by label, whose IDs only the host knows).
    Each word must be a full container ID; anything else is skipped."""
    if not re.fullmatch(r"[a-z_]+", ids_var):
        raise ValueError(f"invalid shell variable name {ids_var!r}")
    return (
        f"for i in ${ids_var}; do case $i in *[!0-9a-f]*) continue ;; esac; "
        f"[ ${{#i}} -eq 64 ] && rm -f {_record_paths('$i')}; done; true"
    )


def _adopted_records(sections: Mapping[str, Section]) -> dict[str, str]:
    """container ID -> cluster name, from the adopted frame (`ID CLUSTER`)."""
    section = sections.get("adopted")
    if section is None:
        return {}
    out: dict[str, str] = {}
    for line in section.stdout.splitlines():
        cid, _, cluster = line.partition(" ")
        if CONTAINER_ID_RE.fullmatch(cid) and cluster.strip():
            out[cid] = cluster.strip()
    return out


def inspect_image_arg(image: str) -> str:
    """The image as the probe's `docker inspect` names it: with a tag or digest.

    `docker inspect` without `--type` resolves each argument as a container
    first; a container name cannot hold ':' or '@', so a tagged reference is
    never mistaken for a container.
    """
    if image.startswith("sha256:"):
        return image
    last = image.rsplit("/", 1)[-1]
    return image if (":" in last or "@" in image) else f"{image}:latest"


# Which docker to try first: the socket's permissions say whether plain
# `docker` can work, without spending a docker process to find out.
_ACCESS_ORDER = access_order("docker", rootless=False)
# podman's half of the probe's inspect (a .sh file shellcheck reads).
PODMAN_INSPECT = (
    resources.files("orchestrator.containers").joinpath("podman_inspect.sh").read_text()
)
# rootless podman's cgroup facts (which caps it can apply at all).
CGROUP_FACTS = resources.files("orchestrator.containers").joinpath("cgroup_facts.sh").read_text()

# One `docker inspect` gives the parser each object's JSON and the shell the
# container's ID, init PID and whether it runs, with no process to pick them
# out: a facts line (F) for an object that has a State, then the object on one
# line (J). `index` because a template meets images too (no State there); on
# the raw JSON docker falls back to, numbers print as written.
INSPECT_FORMAT = (
    '{{if index . "State"}}F {{index . "Id"}} {{.State.Pid}} {{.State.Running}}{{println}}{{end}}'
    "J {{json .}}"
)

# inspect_via MODE DOCKER… TARGETS…: the raw section "inspect.MODE", built
# with builtins from the captured output (no temporary file, no encoder).
# Every line is prefixed, J (an object) or E (anything else: stderr), so no
# output can forge a frame; the first F line is kept in $_f. Succeeds when
# docker answered (what it did not find is absent).
_INSPECT_VIA = r"""
inspect_via() {
  _m=$1; shift
  _out=$("$@" 2>&1 </dev/null 9<&-)
  _rc=$? _f= _nosuch=
  printf '@@cvs:section inspect.%s %s raw\n' "$_m" "$_rc"
  _ifs=$IFS; IFS='
'
  set -f
  for _l in $_out; do
    case $_l in
      'J '*) printf '%s\n' "$_l" ;;
      'F '*) [ -n "$_f" ] || _f=$_l ;;
      *) printf 'E %s\n' "$_l"
        case $_l in 'Error: No such object: '*) _nosuch=1 ;; esac ;;
    esac
  done
  set +f; IFS=$_ifs
  printf '@@cvs:end inspect.%s\n' "$_m"
  [ "$_rc" -eq 0 ] || [ -n "$_nosuch" ]
}
""".strip()

# The facts from the F line, each checked for its shape before any use.
_FACTS = r"""
cid= pid= running=
_facts() { cid=$2 pid=$3 running=$4; }
if [ -n "$_f" ]; then
  set -f; _ifs=$IFS; IFS=' '
  _facts $_f
  IFS=$_ifs; set +f
fi
case $cid in *[!0-9a-f]*) cid= ;; esac
[ ${#cid} -eq 64 ] || cid=
case $pid in ''|0|*[!0-9]*) pid= ;; esac
[ "$running" = true ] || running=
printf '@@cvs:facts %s %s %s\n' "${cid:--}" "${pid:--}" "${running:-no}"
rec=
if [ -n "$cid" ]; then
  st=STATE_DIR
  if [ -r "$st/adopted/$cid" ] && IFS= read -r _who <"$st/adopted/$cid"; then
    [ -n "$_who" ] && printf '@@cvs:adopted %s %s\n' "$cid" "$_who"
  fi
  if [ -r "$st/provisioned/$cid" ]; then
    read -r rec _rest <"$st/provisioned/$cid"
    case $rec in *[!0-9a-f]*) rec= ;; esac
    [ ${#rec} -eq 64 ] || rec=
    [ -n "$rec" ] && printf '@@cvs:record %s %s\n' "$cid" "$rec"
  fi
fi
""".strip().replace("STATE_DIR", STATE_DIR)


def _host_listen_script(port: int) -> str:
    """sh text: when the container runs and its socket table is readable,
    `listen` says whether sshd listens (see _listen_script), from the host.

    The PID is docker's, in dockerd's PID namespace: only when /proc/PID is
    that container here (its cgroup path holds the container ID) is its
    socket table read; otherwise (a login in another PID namespace, the PID
    gone and reused) the in-container check answers instead."""
    return "\n".join(
        [
            "listen=",
            'if [ -n "$running" ] && [ -n "$pid" ] && [ -n "$cid" ] &&',
            '    IFS= read -r _cg 2>/dev/null <"/proc/$pid/cgroup" &&',
            '    case $_cg in *"$cid"*) true ;; *) false ;; esac &&',
            '    [ -r "/proc/$pid/net/tcp" ]; then',
            *("  " + line for line in _listen_loop('"/proc/$pid/net/tcp"', port)),
            '  printf \'@@cvs:listen %s %s\\n\' "$cid" "$listen"',
            "fi",
        ]
    )


# After the in-container fallback found the marker, write the record so the
# next probe needs no `docker exec` (the marker's first word, a sha256).
_RECORD_FROM_EXEC = r"""
if [ -n "$cid" ]; then
  { read -r _l; read -r _m1 _m2; read -r _sha _rest; } <"$tmp/out"
  case $_sha in *[!0-9a-f]*) _sha= ;; esac
  if [ "$_m2" = present ] && [ ${#_sha} -eq 64 ]; then
    WRITE_RECORD
  fi
fi
""".strip().replace("WRITE_RECORD", _write_record("$cid", "$_sha"))


def _port_check(sshd_port: int, runtime: Runtime | None = None) -> list[str]:
    """When our container is not running: is the sshd port taken on the host
    (network host: the container would share it), and by which cvs container.
    `docker ps` runs only when the port is taken, so never on the attach path."""
    holders = [
        "ps",
        "--filter",
        f"label={LABEL_SSHD_PORT}={sshd_port}",
        "--format",
        "{{.Names}}\t" + (runtime or Runtime()).label_column(LABEL_MANAGED),
    ]
    return [
        f"  section port sh -c {shlex.quote(chr(10).join(_listen_script(sshd_port)))}",
        "  if grep -q '^listen yes' \"$tmp/out\"; then",
        f'    section port_holders "$@" {shlex.join(holders)}',
        "  fi",
    ]


def probe_command(
    cfg: ContainerConfig | None,
    name: str,
    *,
    sshd_port: int,
    marker_path: str,
    port_check: bool = False,
    runtime: RuntimeName = "docker",
    rootless: bool = False,
) -> str:
    """The probe script (POSIX sh); run it on the host as `sh -c SCRIPT`.

    `runtime`/`rootless`: which runtime to reach and how to try
    (containers/runtime.py); podman's inspect is `podman_inspect.sh`.

    `cfg` None probes docker access and the container only (no image tag).
    On the attach path it spawns one docker process, `docker inspect` of the
    container and the image together (which also tells the access mode); the
    sshd listener and the provisioning state come from the host (module doc).
    `port_check` (sshd wanted, network host): when the container is not
    running, whether its sshd port is taken on the host, and by whom.
    """
    validate_container_name(name)
    if not 1 <= sshd_port <= 65535:
        raise ValueError(f"invalid sshd port {sshd_port}")
    if not marker_path.startswith("/"):
        raise ValueError(f"marker path must be absolute, got {marker_path!r}")
    targets = [name]
    if cfg is not None:
        targets.append(inspect_image_arg(image_inspect_argv([], cfg.image)[-1]))
    if any(not t or any(c.isspace() for c in t) for t in targets):
        raise ValueError(f"cannot probe {targets!r}: a name holds white space")
    inspect = shlex.join(["inspect", "--format", INSPECT_FORMAT, *targets])
    binary = Runtime(runtime).binary
    if runtime == "podman":
        inspect_call = f'inspect_via "$m" podman_inspect {shlex.join([*targets, "--"])} "$@"'
    else:
        inspect_call = f'inspect_via "$m" "$@" {inspect}'
    # The docker prefix lives in "$@" (set below), so each docker call is
    # `"$@" <quoted argv…>` and nothing user-supplied is ever unquoted.
    exec_argv = ["exec", name, "sh", "-c", _in_container_script(sshd_port, marker_path)]
    cp_argv = ["cp", f"{name}:{marker_path}", "-"]
    lines = [
        _PRELUDE,
        f"printf '@@cvs:runtime %s %s\\n' {binary} {'rootless' if rootless else 'rootful'}",
        access_order(runtime, rootless),
        _INSPECT_VIA,
        *([PODMAN_INSPECT] if runtime == "podman" else []),
        *([CGROUP_FACTS, "cgroup_facts"] if rootless else []),
        f"printf '@@cvs:args %s\\n' {shlex.quote(' '.join(targets))}",
        _CAPACITY,
        "via=",
        "for m in $order; do",
        f'  if [ "$m" = direct ]; then set -- {binary}; else set -- sudo -n {binary}; fi',
        f"  if {inspect_call}; then",
        "    via=$m; break",
        "  fi",
        "done",
        # No access: say whether the other runtime is here (a mixed fleet).
        f'[ -n "$via" ] || {{ command -v {_other(runtime)} >/dev/null 2>&1 && '
        f"printf '@@cvs:other %s\\n' {_other(runtime)}; printf '@@cvs:done\\n'; exit 0; }}",
        _FACTS,
        'if [ -n "$running" ]; then',
        _host_listen_script(sshd_port),
        '  if [ -z "$rec" ] || [ -z "$listen" ]; then',
        f'    if section exec "$@" {shlex.join(exec_argv)}; then',
        _RECORD_FROM_EXEC,
        "    else",
        f'      section marker_tar "$@" {shlex.join(cp_argv)}',
        "    fi",
        "  fi",
        "else",
        '  if [ -z "$rec" ] && [ -n "$_f" ]; then',
        f'    section marker_tar "$@" {shlex.join(cp_argv)}',
        "  fi",
        *(_port_check(sshd_port, Runtime(runtime)) if port_check else []),
        "fi",
        "printf '@@cvs:done\\n'",
    ]
    return "\n".join(lines) + "\n"


def probe_remote_command(
    cfg: ContainerConfig | None, name: str, *, sshd_port: int, marker_path: str
) -> str:
    """`sh -c '<probe script>'`: ready for an SSH exec whatever the login shell is."""
    script = probe_command(cfg, name, sshd_port=sshd_port, marker_path=marker_path)
    return shlex.join(["sh", "-c", script])


# --- parsing -------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    name: str
    rc: int
    out: bytes
    err: bytes

    @property
    def stdout(self) -> str:
        return self.out.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", errors="replace")


# One-line facts the script prints as `@@cvs:TAG WORDS…` (see the module doc).
LINE_FRAMES = frozenset(
    {"args", "capacity", "facts", "adopted", "record", "listen", "runtime", "other", "cgroup"}
)


class ProbeOutputError(ValueError):
    pass


def _decode(enc: str, lines: list[str]) -> bytes:
    try:
        if enc == "b64":
            raw = base64.b64decode("".join(lines), validate=True)
        elif enc == "hex":
            raw = bytes.fromhex("".join("".join(lines).split()))
        else:
            raise ProbeOutputError(f"unknown encoding {enc!r}")
    except (binascii.Error, ValueError) as exc:
        raise ProbeOutputError(f"undecodable section body: {exc}") from None
    return raw


def _raw_section(name: str, rc: int, lines: list[str]) -> Section:
    """An `inspect_via` section: J lines are the objects (as docker's default
    JSON list), E lines stderr; any other line means the output is not ours."""
    objects: list[str] = []
    err: list[str] = []
    for line in lines:
        if line.startswith("J "):
            objects.append(line[2:])
        elif line.startswith("E "):
            err.append(line[2:])
        else:
            raise ProbeOutputError(f"unexpected line in section {name!r}: {line[:80]!r}")
    out = ("[" + ",".join(objects) + "]") if objects else ""
    return Section(name, rc, out.encode(), "".join(e + "\n" for e in err).encode())


def parse_sections(stdout: str) -> tuple[dict[str, Section], bool]:
    """Framed sections by name, and whether the `done` frame was seen."""
    sections: dict[str, Section] = {}
    done = False
    current: tuple[str, int, str] | None = None
    body: list[str] = []
    err: list[str] | None = None
    for line in stdout.splitlines():
        if not line.startswith(FRAME):
            if current is None:
                continue  # e.g. a login banner or motd ahead of the script's output
            if current[2] == "raw":
                body.append(line)
            else:
                (body if err is None else err).append(line.strip())
            continue
        words = line[len(FRAME) :].split()
        if not words:
            raise ProbeOutputError(f"bad frame line {line!r}")
        tag = words[0]
        if tag == "section" and current is None and len(words) == 4:
            try:
                current = (words[1], int(words[2]), words[3])
            except ValueError:
                raise ProbeOutputError(f"bad frame line {line!r}") from None
            body, err = [], None
        elif tag == "stderr" and current is not None and err is None and current[2] != "raw":
            err = []
        elif (
            tag == "end"
            and current is not None
            and current[2] == "raw"
            and words[1:] == [current[0]]
        ):
            sections[current[0]] = _raw_section(current[0], current[1], body)
            current = None
        elif tag == "end" and current is not None and err is not None and words[1:] == [current[0]]:
            name, rc, enc = current
            sections[name] = Section(name, rc, _decode(enc, body), _decode(enc, err))
            current = None
        elif tag == "done" and current is None:
            done = True
        elif tag in LINE_FRAMES and current is None:
            rest = line[len(FRAME) + len(tag) :].strip()
            sections[tag] = Section(tag, 0, rest.encode(), b"")
        elif tag == "probe" and current is None:
            pass
        else:
            raise ProbeOutputError(f"unexpected frame line {line!r}")
    if current is not None:
        raise ProbeOutputError(f"section {current[0]!r} not terminated")
    return sections, done


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _marker_value(text: str) -> str | None:
    text = text.strip()
    if not text:
        return None
    # Accept `sha256sum` output ("<hex>  <file>") as well as a bare digest.
    m = _SHA256_RE.match(text)
    return m.group(0) if m else text


def _marker_from_tar(raw: bytes) -> str | None:
    # `docker cp NAME:FILE -` writes a tar holding that one file.
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    return _marker_value(f.read().decode("utf-8", "replace")) if f else None
    except tarfile.TarError:
        return None
    return None


def _other(runtime: RuntimeName) -> str:
    return "podman" if runtime == "docker" else "docker"


def _access_failure(
    host: str,
    direct: Section | None,
    sudo: Section | None,
    runtime: RuntimeName = "docker",
    other: str | None = None,
    rootless: bool = False,
) -> HostState:
    texts = [s for s in (direct, sudo) if s is not None]
    kinds = [classify_docker_error(s.stderr or s.stdout, s.rc) for s in texts]
    labels = [
        label for label, s in ((runtime, direct), (f"sudo -n {runtime}", sudo)) if s is not None
    ]
    detail = "; ".join(
        f"{label}: {_first_line(s.stderr or s.stdout) or f'exit {s.rc}'}"
        for label, s in zip(labels, texts, strict=True)
    )
    state = (
        _docker_access_failure(host, kinds, detail)
        if runtime == "docker"
        else _podman_access_failure(host, runtime, kinds, detail, rootless)
    )
    if other is None or state.error is None:
        return state
    # The other runtime is here: perhaps the cluster names the wrong one.
    return replace(
        state,
        error=(
            f"{state.error}; this host has {other}: a cluster runs one runtime on every "
            f"host (image IDs, CLI spellings and GPU flags differ), so set "
            f"container.runtime: {other} if every host runs it, or split the cluster"
        ),
    )


def _docker_access_failure(host: str, kinds: Sequence[str], detail: str) -> HostState:
    if "daemon_down" in kinds:
        return HostState(
            host=host,
            error=f"docker daemon not reachable ({detail})",
            error_kind="daemon_down",
        )
    if kinds and kinds[0] == "not_installed":
        return HostState(
            host=host,
            docker_access="none",
            error=f"docker is not installed or not on PATH ({detail})",
            error_kind="no_docker",
        )
    return HostState(
        host=host,
        docker_access="none",
        error=(
            "no docker access: plain `docker` and `sudo -n docker` both failed "
            f"({detail}); add the login user to the docker group or allow it "
            "passwordless sudo for docker"
        ),
        error_kind="no_access",
    )


def _podman_access_failure(
    host: str, runtime: RuntimeName, kinds: Sequence[str], detail: str, rootless: bool
) -> HostState:
    """No access to podman: the message names the runtime and the fix."""
    if kinds and kinds[-1] == "not_installed":
        return HostState(
            host=host,
            docker_access="none",
            runtime=runtime,
            error=f"{runtime} is not installed or not on PATH ({detail})",
            error_kind="no_docker",
        )
    how = (
        "rootless podman needs the login user's subuid/subgid ranges (/etc/subuid)"
        if rootless
        else f"log in as root or allow the login user passwordless `sudo -n {runtime}`"
    )
    return HostState(
        host=host,
        docker_access="none",
        runtime=runtime,
        error=f"no {runtime} access ({detail}); {how}",
        error_kind="no_access",
    )


_CONTROLLER_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _cgroup_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """cgroup and cgroup_controllers from the cgroup frame (rootless only);
    words from the host are kept only when they look like controller names."""
    words = sections["cgroup"].stdout.split() if "cgroup" in sections else []
    if not words or words[0] not in ("v1", "v2"):
        return {}
    controllers = tuple(w for w in words[1:] if _CONTROLLER_RE.fullmatch(w))
    return {"cgroup": words[0], "cgroup_controllers": controllers}


def _runtime_frame(sections: Mapping[str, Section]) -> tuple[RuntimeName, bool]:
    words = sections["runtime"].stdout.split() if "runtime" in sections else []
    runtime: RuntimeName = "podman" if words[:1] == ["podman"] else "docker"
    return runtime, words[1:2] == ["rootless"]


def parse_probe_output(host: str, exit_status: int, stdout: str, stderr: str) -> HostState:
    """The probe's output on `host` -> HostState. Never raises on bad output."""
    try:
        sections, done = parse_sections(stdout)
    except ProbeOutputError as exc:
        return _garbled(host, str(exc), exit_status, stderr)
    if not done or exit_status != 0:
        why = "probe did not finish" if not done else f"probe exited {exit_status}"
        return _garbled(host, why, exit_status, stderr)

    tried = {n.split(".", 1)[1]: sec for n, sec in sections.items() if n.startswith("inspect.")}
    if not tried:
        return _garbled(host, "no docker inspect section", exit_status, stderr)
    answered = [m for m, sec in tried.items() if _answered(sec)]
    runtime, rootless = _runtime_frame(sections)
    if not answered:
        other = sections["other"].stdout.strip() if "other" in sections else None
        failed = _access_failure(
            host, tried.get("direct"), tried.get("sudo"), runtime, other, rootless
        )
        return replace(failed, runtime=runtime, rootless=rootless)
    access: DockerAccessMode = "direct" if answered[0] == "direct" else "sudo"
    inspect = tried[answered[0]]
    values: dict[str, object] = {
        "host": host,
        "docker_access": access,
        "runtime": runtime,
        "rootless": rootless,
        **_cgroup_facts(sections),
    }
    values.update(_capacity_facts(sections))  # capacity (issue 15)
    values.update(_port_facts(sections))  # sshd port taken on the host (network host)
    try:
        objects = _inspect_objects(inspect.stdout)
    except DockerOutputError as exc:
        return HostState(**values, error=str(exc), error_kind="garbled")  # type: ignore[arg-type]
    missing = set(_NO_SUCH_RE.findall(inspect.stderr))
    # `docker inspect A B` prints the objects it found in argument order and
    # names the missing ones on stderr: pair them up positionally.
    args = sections["args"].stdout.split() if "args" in sections else []
    if not args:
        return _garbled(host, "no args section", exit_status, stderr)
    name = args[0]
    found: dict[str, dict[str, Any] | None] = {}
    queue = list(objects)
    for arg in args:
        found[arg] = None if arg in missing or not queue else queue.pop(0)
    if len(args) > 1:
        values.update(_image_facts(args[1], found.get(args[1]), inspect.stderr))
    cobj = found.get(name)
    if cobj is None or not _is_container(cobj, name):
        # Not found, or NAME resolved to something else (an image of that
        # name, a container whose ID merely starts with it): no such container.
        return HostState(**values, container="absent")  # type: ignore[arg-type]
    try:
        cinfo = parse_container_inspect(json.dumps(cobj))
    except DockerOutputError as exc:
        return HostState(**values, error=str(exc), error_kind="garbled")  # type: ignore[arg-type]

    labels = cinfo.labels
    adopted_by = _adopted_records(sections).get(cinfo.id or "")
    if adopted_by is not None and LABEL_MANAGED not in labels:
        # Adopted (issue 15): owned as if cvs had labelled it at start.
        labels = MappingProxyType({**labels, LABEL_MANAGED: adopted_by})
    values.update(
        container=cinfo.state,
        container_status=cinfo.status,
        container_id=cinfo.id,
        container_image_id=cinfo.image_id,
        container_image_readable=cinfo.image_id is not None
        and cinfo.image_id.startswith("sha256:"),
        labels=labels,
        started_at=cinfo.started_at,
        host_config=Runtime(runtime).normalize_limits(cinfo.limits),
    )
    values.update(
        _in_container_facts(sections, running=cinfo.state == "running", container_id=cinfo.id)
    )
    return HostState(**values)  # type: ignore[arg-type]


_NO_SUCH_RE = re.compile(r"^Error: No such object: (\S+)\s*$", re.MULTILINE)


def _answered(section: Section) -> bool:
    """docker reached the daemon and answered: what it did not find is absent.

    (Other stderr lines, like sudo's "unable to resolve host", are noise.)
    """
    return section.rc == 0 or bool(_NO_SUCH_RE.search(section.stderr))


def _inspect_objects(text: str) -> list[dict[str, Any]]:
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DockerOutputError(f"docker inspect: not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, list) or not all(isinstance(o, dict) for o in data):
        raise DockerOutputError("docker inspect: expected a JSON list of objects")
    return data


def _is_container(obj: Mapping[str, Any], name: str) -> bool:
    return isinstance(obj.get("State"), dict) and str(obj.get("Name", "")).lstrip("/") == name


def _image_facts(arg: str, obj: Mapping[str, Any] | None, stderr: str) -> dict[str, object]:
    if obj is None:
        if arg in _NO_SUCH_RE.findall(stderr):
            return {}  # not on the host: tag_image_id None
        return {"tag_error": f"docker inspect gave no answer for {arg}"}
    if "State" in obj or "RootFS" not in obj:
        return {"tag_error": f"{arg} does not name an image here"}
    try:
        info = parse_image_inspect(json.dumps(obj))
    except DockerOutputError as exc:
        return {"tag_error": str(exc)}
    return {"tag_image_id": info.id, "tag_repo_digests": info.repo_digests}


def _port_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    port = sections.get("port")
    if port is None:
        return {}
    words = port.stdout.split()
    busy = {"yes": True, "no": False}.get(words[1] if words[1:2] and words[0] == "listen" else "")
    holders: list[str] = []
    listing = sections.get("port_holders")
    if listing is not None and listing.rc == 0:
        for line in listing.stdout.splitlines():
            cname, _, cluster = line.partition("\t")
            if cname.strip():
                holders.append(f"{cname.strip()} (cluster {cluster.strip() or '?'})")
    return {"sshd_port_busy": busy, "sshd_port_holders": tuple(holders)}


def _host_record(sections: Mapping[str, Section], tag: str, container_id: str | None) -> str | None:
    """The value of line frame `tag` (`ID VALUE`) when it is about `container_id`."""
    section = sections.get(tag)
    if section is None or container_id is None:
        return None
    words = section.stdout.split()
    return words[1] if len(words) == 2 and words[0] == container_id else None


def _in_container_facts(
    sections: Mapping[str, Section], *, running: bool, container_id: str | None
) -> dict[str, object]:
    """sshd liveness and the provisioning marker: from the host's records and
    the container's socket table when the probe had them, else from the
    in-container check (`exec`) or the marker copied out (`marker_tar`)."""
    facts: dict[str, object] = {}
    listen = _host_record(sections, "listen", container_id) if running else None
    record = _host_record(sections, "record", container_id)
    if listen in ("yes", "no"):
        facts["sshd_listening"] = listen == "yes"
    if record is not None and _SHA256_RE.match(record):
        facts["provision_marker"] = record
    ex = sections.get("exec")
    if ex is not None and ex.rc == 0 and running:
        lines = ex.stdout.splitlines()
        words = lines[0].split() if lines else []
        marker = lines[1].split() if len(lines) > 1 else []
        if words[:1] != ["listen"] or marker[:1] != ["marker"]:
            facts["exec_error"] = "unexpected output from the in-container check"
            return facts
        if "sshd_listening" not in facts:
            facts["sshd_listening"] = {"yes": True, "no": False}.get(words[1] if words[1:] else "")
        if marker[1:] == ["present"] and "provision_marker" not in facts:
            facts["provision_marker"] = _marker_value("\n".join(lines[2:]))
        return facts
    if ex is not None and ex.rc != 0 and running:
        facts["exec_error"] = _first_line(ex.stderr) or f"docker exec exited {ex.rc}"
    tar = sections.get("marker_tar")
    if tar is not None and tar.rc == 0 and "provision_marker" not in facts:
        facts["provision_marker"] = _marker_from_tar(tar.out)
    return facts


def _garbled(host: str, why: str, exit_status: int, stderr: str) -> HostState:
    tail = _first_line(stderr[-2000:]) if stderr else ""
    detail = f"{why} (exit {exit_status})" + (f": {tail}" if tail else "")
    return HostState(host=host, error=f"unreadable probe output: {detail}", error_kind="garbled")
