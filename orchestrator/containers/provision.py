"""Provisioning a freshly launched container: the setup script, then its sshd.

Both steps are one `docker exec -i` each, over the host's reused SSH
connection. Everything variable (the script, keys, config files) travels
base64-encoded on the channel's standard input; argv holds only a small fixed
program and non-secret arguments. So there is no argv size limit (a 1 MiB
script is fine), and no key ever shows up in `ps` or in logs.

Setup script: the fixed decoder checks for `base64` and `sha256sum`, decodes
the payload, verifies its sha256 against the digest given in argv (a
corrupted payload is refused), runs it with `bash -o pipefail` (or `sh` when
the image has no bash, saying so) and only on success writes MARKER_PATH
(atomically) with the script's sha256. Any failure leaves no marker, so the
next `cvs up` provisions again instead of attaching to a half-built
container. `probe.py` reads the marker back from MARKER_PATH.

sshd: the files are installed, then sshd is left alone if its pidfile names a
live sshd AND something listens on the port over IPv4 (read from
/proc/net/tcp; no `pgrep -f` that could match the check itself); otherwise it is (re)started
and must be listening within a few seconds. The report has `sshd: started` or
`sshd: already running`, and `sshd-pid N`.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.config import ClusterConfig, ConfigError, ContainerConfig
from orchestrator.config.loader import read_default_setup_script
from orchestrator.config.model import CONTAINER_USER_RE
from orchestrator.containers import mpi
from orchestrator.containers.docker import exec_argv
from orchestrator.containers.probe import provision_record_command
from orchestrator.results import HostResult
from orchestrator.ssh.keys import ClusterKeys

# Provisioning (setup script, marker, sshd) writes /etc, /run, /var/lib and
# runs package managers: it runs as root whatever the image's USER is.
# Commands and steps run as the image's user (or container.user / -u).
ROOT = "0"

# Inside the container: the sha256 of the script that provisioned it.
MARKER_PATH = "/var/lib/cvs/provisioned"

# Exit codes of the fixed in-container programs. A setup script's own exit
# code is passed through; stderr always carries a `cvs:` line saying which.
EXIT_MISSING_TOOL = 90  # base64 / sha256sum missing in the image
EXIT_BAD_PAYLOAD = 91  # payload not decodable, or frames incomplete
EXIT_CHECKSUM = 92  # decoded script's sha256 differs: refused, not run
EXIT_MARKER = 93  # script ran, marker could not be written
EXIT_NO_SSHD = 94  # /usr/sbin/sshd missing
EXIT_SSHD_START = 95  # sshd exited with an error on start
EXIT_SSHD_NOT_LISTENING = 96  # sshd started but does not listen on the port
EXIT_INSTALL = 97  # writing the sshd / ssh files failed

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


# --- setup script --------------------------------------------------------


@dataclass(frozen=True)
class SetupScript:
    path: str
    content: bytes
    sha256: str
    is_default: bool

    @classmethod
    def from_bytes(cls, content: bytes, *, path: str = "<memory>") -> SetupScript:
        return cls(path, content, hashlib.sha256(content).hexdigest(), is_default=False)

    @classmethod
    def default(cls) -> SetupScript:
        try:
            path, content = read_default_setup_script()
        except (OSError, ModuleNotFoundError) as exc:
            raise ConfigError(
                f"the packaged default setup script cannot be read ({exc}): "
                "reinstall cvs-orchestrator or set container.setup_script"
            ) from None
        return cls(path, content, hashlib.sha256(content).hexdigest(), is_default=True)

    @classmethod
    def for_config(cls, cfg: ContainerConfig) -> SetupScript:
        """The script read when the cluster file loaded; else (a config built in
        code) the configured file or the packaged default, read now.

        An unreadable script is a ConfigError (exit 2, one line), raised before
        any host is touched when it comes from the loader.
        """
        loaded = cfg.loaded_setup_script
        custom = bool(cfg.setup_script and cfg.setup_script.strip())
        if loaded is not None:
            path, content = loaded
            return cls(path, content, hashlib.sha256(content).hexdigest(), is_default=not custom)
        if not custom:
            return cls.default()
        script_path = Path(str(cfg.setup_script)).expanduser()
        try:
            content = script_path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                "container.setup_script: cannot read setup script "
                f"{script_path}: {exc.strerror or exc}"
            ) from None
        return cls.from_bytes(content, path=str(script_path))


# POSIX sh, run as `sh -c SETUP_DECODER cvs-setup SHA256 MARKER`. Fixed text:
# the script itself only ever arrives on stdin.
SETUP_DECODER = f"""
sha=$1 marker=$2
umask 077
missing=
for tool in base64 sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
  echo "cvs: the container image lacks:$missing (needed to receive the setup script)" >&2
  exit {EXIT_MISSING_TOOL}
fi
# Whatever happens next, a previous marker no longer describes this container.
rm -f "$marker"
dir=$(mktemp -d 2>/dev/null) \\
  || {{ dir=/tmp/cvs-setup.$$; mkdir "$dir" || exit {EXIT_BAD_PAYLOAD}; }}
trap 'rm -rf "$dir"' EXIT
trap 'exit 143' HUP INT TERM
if ! base64 -d > "$dir/script"; then
  echo "cvs: could not decode the setup script payload (base64)" >&2
  exit {EXIT_BAD_PAYLOAD}
fi
got=$(sha256sum < "$dir/script") || exit {EXIT_MISSING_TOOL}
got=${{got%% *}}
if [ "$got" != "$sha" ]; then
  echo "cvs: setup script checksum mismatch: expected $sha, got $got; refusing to run it" >&2
  exit {EXIT_CHECKSUM}
fi
echo $$ > /tmp/cvs-setup.pid 2>/dev/null
if command -v bash >/dev/null 2>&1; then
  bash -o pipefail "$dir/script" < /dev/null
  rc=$?
elif (set -o pipefail) 2>/dev/null; then
  echo "cvs: bash not found in the container; running the setup script with sh -o pipefail" >&2
  sh -o pipefail "$dir/script" < /dev/null
  rc=$?
else
  echo "cvs: bash not found in the container; running the setup script with sh (no pipefail)" >&2
  sh "$dir/script" < /dev/null
  rc=$?
fi
rm -f /tmp/cvs-setup.pid
if [ "$rc" -ne 0 ]; then
  echo "cvs: setup script failed with exit code $rc; container not marked as provisioned" >&2
  exit "$rc"
fi
tmpmark="$marker.tmp.$$"
# Readable by the image's user: the probe reads the marker as that user.
if mkdir -p "${{marker%/*}}" && chmod 755 "${{marker%/*}}" \\
    && printf '%s\\n' "$sha" > "$tmpmark" && chmod 644 "$tmpmark" \\
    && mv -f "$tmpmark" "$marker"; then
  echo "cvs: provisioned, marker $sha"
  exit 0
fi
rm -f "$tmpmark" "$marker"
echo "cvs: setup script succeeded but the marker $marker could not be written" >&2
exit {EXIT_MARKER}
""".lstrip()

# Stops a timed-out setup script inside the container: killing the docker
# client on the host does not stop the exec'd process.
_SETUP_KILL = r"""
p=$(cat /tmp/cvs-setup.pid 2>/dev/null) || exit 0
case "$p" in ''|*[!0-9]*) exit 0;; esac
# runc starts each exec'd process as a session (and group) leader: the group
# is the decoder, the script and whatever it started.
kill -TERM -"$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
exit 0
""".lstrip()


def setup_payload(content: bytes) -> str:
    """The script as it goes on stdin: base64, 76-column lines."""
    return base64.encodebytes(content).decode("ascii")


def setup_argv(
    prefix: Sequence[str], container: str, sha256: str, *, marker_path: str = MARKER_PATH
) -> list[str]:
    """`docker exec -i CONTAINER sh -c DECODER cvs-setup SHA MARKER` (stdin: the payload)."""
    if not _SHA256_RE.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    if not marker_path.startswith("/"):
        raise ValueError(f"marker path must be absolute, got {marker_path!r}")
    return exec_argv(
        prefix,
        container,
        ["sh", "-c", SETUP_DECODER, "cvs-setup", sha256, marker_path],
        interactive=True,
        user=ROOT,
    )


async def run_setup_script(
    pool: Any,
    host: str,
    prefix: list[str],
    container: str,
    script: SetupScript,
    *,
    timeout: float | None = None,
    container_id: str | None = None,
) -> HostResult:
    """Deliver and run `script` in the container; the marker is written only on success.

    With `container_id`, success also leaves the provisioning record on the
    host (`probe.provision_record_command`), in the same round trip: the
    next probe then knows without a `docker exec`.

    The result carries the script's output (stdout/stderr) for the run log;
    `result.tail()` is what to show for a failing host.
    """
    argv = setup_argv(prefix, container, script.sha256)
    command: str | list[str] = argv
    if container_id is not None:
        record = provision_record_command(container_id, script.sha256)
        command = f"{shlex.join(argv)} && {{ {record}; }}"
    kill = exec_argv(prefix, container, ["sh", "-c", _SETUP_KILL], user=ROOT)
    result: HostResult = await pool.run(
        host,
        command,
        timeout=timeout,
        input=setup_payload(script.content),
        label="setup",
        on_timeout=lambda: kill,
    )
    return result


# --- in-container sshd ---------------------------------------------------


# The files ensure_sshd sends, by frame name (the installer knows where each goes).
SSHD_FILES = (
    "host_key",
    "user_key",
    "user_key_pub",
    "authorized_keys",
    "known_hosts",
    "ssh_config",
    "sshd_config",
    "hostfile",
)


def sshd_files(cluster: ClusterConfig, keys: ClusterKeys, host: str) -> dict[str, str]:
    """What one container needs, by SSHD_FILES name (pure)."""
    container = cluster.container
    if container is None:
        raise ValueError("the cluster has no container block")
    port = container.sshd.port
    return {
        "host_key": keys.host_key(host).private,
        "user_key": keys.user.private,
        "user_key_pub": keys.user.public + "\n",
        "authorized_keys": keys.user.public + "\n",
        "known_hosts": mpi.known_hosts_text(cluster, keys, port),
        "ssh_config": mpi.ssh_config_text(cluster, port),
        "sshd_config": mpi.sshd_config_text(port),
        "hostfile": mpi.hostfile_text(cluster, container.mpi.slots),
    }


def frame_files(files: dict[str, str]) -> str:
    """`@@cvs-file NAME` / base64 lines / `@@cvs-end` per file, then `@@cvs-done`.

    Bodies are base64, so no file content can look like a frame line.
    """
    parts = []
    for name, text in files.items():
        if not re.fullmatch(r"[a-z_]+", name):
            raise ValueError(f"invalid frame name {name!r}")
        parts.append(f"@@cvs-file {name}\n")
        parts.append(base64.encodebytes(text.encode()).decode("ascii"))
        parts.append("@@cvs-end\n")
    parts.append("@@cvs-done\n")
    return "".join(parts)


# POSIX sh, run as root: `sh -c SSHD_PROGRAM cvs-sshd PORT PORT_HEX HOSTFILE
# LOGIN` (LOGIN: the image's USER or container.user, may be empty); the files
# arrive framed on stdin (see frame_files).
SSHD_PROGRAM = f"""
port=$1 port_hex=$2 hostfile=$3 login=${{4%%:*}}
umask 077
pidfile={mpi.SSHD_PID_FILE}
config={mpi.SSHD_CONFIG_PATH}
fail() {{ code=$1; shift; echo "cvs: $*" >&2; exit "$code"; }}
command -v base64 >/dev/null 2>&1 \\
  || fail {EXIT_MISSING_TOOL} "the container image lacks: base64 (needed to receive the sshd files)"
[ -x /usr/sbin/sshd ] || fail {EXIT_NO_SSHD} \\
  "image has no sshd (/usr/sbin/sshd): use an image with openssh-server or the default setup script"
dir=$(mktemp -d 2>/dev/null) || {{ dir=/tmp/cvs-sshd.$$; mkdir "$dir" || exit {EXIT_INSTALL}; }}
trap 'rm -rf "$dir"' EXIT
cur= done=
while IFS= read -r line; do
  case "$line" in
    '@@cvs-file '*)
      cur=${{line#@@cvs-file }}
      case "$cur" in ''|*[!a-z_]*) fail {EXIT_BAD_PAYLOAD} "bad frame name";; esac
      : > "$dir/$cur.b64" ;;
    '@@cvs-end')
      [ -n "$cur" ] || fail {EXIT_BAD_PAYLOAD} "frame end without a file"
      base64 -d < "$dir/$cur.b64" > "$dir/$cur" || fail {EXIT_BAD_PAYLOAD} "undecodable $cur"
      cur= ;;
    '@@cvs-done') done=1; break ;;
    *) [ -n "$cur" ] && printf '%s\\n' "$line" >> "$dir/$cur.b64" ;;
  esac
done
[ -n "$done" ] || fail {EXIT_BAD_PAYLOAD} "truncated sshd payload"
for f in {" ".join(SSHD_FILES)}; do
  [ -f "$dir/$f" ] || fail {EXIT_BAD_PAYLOAD} "sshd payload lacks $f"
done
# Who runs commands here: the image's USER (or container.user), root if unset.
user=root uid=0 gid=0 home=/root
if [ -n "$login" ] && [ "$login" != root ] && [ "$login" != 0 ]; then
  found=
  while IFS=: read -r n _pw u g _gecos h _shell; do
    if [ "$n" = "$login" ] || [ "$u" = "$login" ]; then
      found=1 user=$n uid=$u gid=$g home=$h; break
    fi
  done < /etc/passwd
  [ -n "$found" ] || fail {EXIT_INSTALL} \\
    "the container's user $login is not in /etc/passwd: cannot install its ssh files"
fi
put() {{
  mkdir -p "${{2%/*}}" && cp "$dir/$1" "$2.cvs-tmp" && chmod "$3" "$2.cvs-tmp" \\
    && chown "$4" "$2.cvs-tmp" && mv -f "$2.cvs-tmp" "$2" \\
    || fail {EXIT_INSTALL} "could not write $2"
}}
put host_key {mpi.HOST_KEY_PATH} 600 0:0
put sshd_config "$config" 600 0:0
put hostfile "$hostfile" 644 0:0
# The cluster key, known hosts and ssh config for root and, when it is
# someone else, for the image's user: `ssh peer` works as either.
for who in "root 0 0 /root" "$user $uid $gid $home"; do
  set -- $who
  h=$4 owner=$2:$3
  {{ [ "$h" = / ] || [ -z "$h" ]; }} && continue
  mkdir -p "$h/.ssh" && chmod 700 "$h/.ssh" && chown "$owner" "$h/.ssh" \\
    || fail {EXIT_INSTALL} "could not create $h/.ssh"
  put user_key "$h/.ssh/{mpi.USER_KEY_NAME}" 600 "$owner"
  put user_key_pub "$h/.ssh/{mpi.USER_KEY_NAME}.pub" 644 "$owner"
  put known_hosts "$h/.ssh/{mpi.KNOWN_HOSTS_NAME}" 644 "$owner"
  put ssh_config "$h/.ssh/config" 600 "$owner"
  # Keep keys the image put there; replace only the orchestrator's own.
  {{ [ -f "$h/.ssh/authorized_keys" ] && grep -v ' cvs-cluster@' "$h/.ssh/authorized_keys"
    cat "$dir/authorized_keys"; }} > "$dir/ak"
  put ak "$h/.ssh/authorized_keys" 600 "$owner"
  [ "$1" = "$user" ] && break
done
# With UsePAM no, sshd refuses any login to a locked account ('!' password).
for who in root "$user"; do
  case "$who" in ''|*[!A-Za-z0-9_.-]*) continue ;; esac
  if [ -w /etc/shadow ] && grep -q "^$who:!" /etc/shadow; then
    sed -i "s/^$who:![^:]*:/$who:*:/" /etc/shadow && echo "sshd: unlocked $who for key-only login"
  fi
done

# Over IPv4 (tcp6 only where there is no IPv4 table): peers dial IPv4
# addresses, and an sshd whose IPv4 port was taken binds IPv6 alone.
listening() {{
  f=/proc/net/tcp
  [ -r "$f" ] || f=/proc/net/tcp6
  [ -r "$f" ] || return 1
  while read -r _sl local _rem st _rest; do
    case "$local" in *":$port_hex") [ "$st" = 0A ] && return 0 ;; esac
  done < "$f"
  return 1
}}
pid_alive() {{
  pid=
  [ -r "$pidfile" ] && read -r pid < "$pidfile" || return 1
  case "$pid" in ''|*[!0-9]*) return 1 ;; esac
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  # sshd reparents to the container's init, which may not reap: a zombie is dead.
  case "${{stat##*) }}" in Z*|X*) return 1 ;; esac
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sshd ]
}}
nap() {{ sleep 0.1 2>/dev/null || sleep 1; }}

if pid_alive && listening; then
  echo "sshd: already running"
  echo "sshd-pid $pid"
  exit 0
fi
if pid_alive; then
  # Ours (pidfile) but not on this port (e.g. the port changed): replace it.
  kill "$pid" 2>/dev/null
  i=0; while pid_alive && [ $i -lt 30 ]; do nap; i=$((i+1)); done
fi
rm -f "$pidfile"
mkdir -p /run/sshd && chmod 755 /run/sshd
/usr/sbin/sshd -f "$config" -E /var/log/cvs-sshd.log < /dev/null
rc=$?
if [ $rc -ne 0 ]; then
  tail -n 5 /var/log/cvs-sshd.log >&2 2>/dev/null
  fail {EXIT_SSHD_START} "sshd failed to start (exit $rc); log: /var/log/cvs-sshd.log"
fi
i=0
while [ $i -lt 50 ]; do
  if pid_alive && listening; then
    echo "sshd: started"
    echo "sshd-pid $pid"
    exit 0
  fi
  nap; i=$((i+1))
done
tail -n 5 /var/log/cvs-sshd.log >&2 2>/dev/null
fail {EXIT_SSHD_NOT_LISTENING} "sshd started but nothing listens on port $port after 5s"
""".lstrip()


def ensure_sshd_argv(
    prefix: Sequence[str], container: str, port: int, hostfile: str, login: str = ""
) -> list[str]:
    """`docker exec -i -u 0 CONTAINER sh -c SSHD_PROGRAM cvs-sshd PORT HEX HOSTFILE LOGIN`."""
    if not 1 <= port <= 65535:
        raise ValueError(f"invalid sshd port {port}")
    if not hostfile.startswith("/") or "\n" in hostfile:
        raise ValueError(f"MPI hostfile path must be absolute, got {hostfile!r}")
    if login and not CONTAINER_USER_RE.fullmatch(login):
        raise ValueError(f"invalid container user {login!r}")
    # /proc/net/tcp shows ports as 4 upper-case hex digits.
    return exec_argv(
        prefix,
        container,
        ["sh", "-c", SSHD_PROGRAM, "cvs-sshd", str(port), f"{port:04X}", hostfile, login],
        interactive=True,
        user=ROOT,
    )


def ensure_sshd_command(
    prefix: Sequence[str], container: str, port: int, hostfile: str, login: str | None
) -> str:
    """Host shell text for ensure_sshd: the login user is `login` (container.user)
    or, when unset, the image's USER read from the container on the host."""
    if login is not None:
        return shlex.join(ensure_sshd_argv(prefix, container, port, hostfile, login))
    argv = ensure_sshd_argv(prefix, container, port, hostfile, "LOGIN")
    user_of = [*prefix, "inspect", "--type", "container", "-f", "{{.Config.User}}", container]
    # Docker's USER is free text: pass it on only if it is a plain user spec.
    return (
        f"u=$({shlex.join(user_of)} 2>/dev/null); "
        'case "$u" in *[!A-Za-z0-9_.:-]*) u= ;; esac; '
        f'exec {shlex.join(argv[:-1])} "$u"'
    )


async def ensure_sshd(
    pool: Any,
    host: str,
    prefix: list[str],
    container: str,
    cluster: ClusterConfig,
    keys: ClusterKeys,
) -> HostResult:
    """Install keys/configs and make sure the container's sshd runs and listens.

    Runs as root in the container; the cluster key and ssh config go to root
    and to the user commands run as (container.user, else the image's USER).
    Idempotent: a live, listening sshd is left as it is (same pid).
    """
    if cluster.container is None:
        raise ValueError("the cluster has no container block")
    command = ensure_sshd_command(
        prefix,
        container,
        cluster.container.sshd.port,
        cluster.container.mpi.hostfile,
        cluster.container.user,
    )
    payload = frame_files(sshd_files(cluster, keys, host))
    # One docker exec that also waits for the listener: twice the bound of a
    # quick docker call (container.docker_timeout; 60 s by default).
    bound = 2 * cluster.container.docker_timeout
    result: HostResult = await pool.run(host, command, input=payload, label="sshd", timeout=bound)
    if result.status == "timeout":
        result = replace(
            result,
            error=f"the in-container sshd did not start within {bound:g}s (twice "
            "container.docker_timeout): the container runtime on this host is slow or hung",
        )
    return result


@dataclass(frozen=True)
class SSHDReport:
    pid: int | None
    started: bool  # False: it was already running


def parse_sshd_report(stdout: str) -> SSHDReport:
    """`sshd-pid N` and `sshd: started|already running` from ensure_sshd's stdout."""
    pid = None
    started = False
    for line in stdout.splitlines():
        m = re.fullmatch(r"sshd-pid (\d+)", line.strip())
        if m:
            pid = int(m.group(1))
        elif line.strip() == "sshd: started":
            started = True
    return SSHDReport(pid, started)
