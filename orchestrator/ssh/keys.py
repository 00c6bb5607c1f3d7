"""Per-cluster SSH keys for container-to-container ssh (MPI).

The orchestrator generates its own keys locally and installs those in the
containers; the user's own private keys (~/.ssh) never enter a container.

- one ed25519 user key pair per cluster: root in every container logs in to
  every peer with it;
- one ed25519 sshd host key per host: the containers' known_hosts lists them,
  so peers connect with strict host-key checking and no prompts.

Keys live in the cluster's state directory (0700; key files 0600) and are
reused across runs: a persistent container keeps working, and known_hosts
stays valid, when `cvs up` runs again in a new process. A host added to the
cluster later gets a new host key; the others keep theirs.

Layout:

    STATE_DIR/keys/cluster_ed25519{,.pub}
    STATE_DIR/keys/hosts/<host>_ed25519{,.pub}
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from orchestrator.config import HOST_NAME_RE, ClusterConfig
from orchestrator.errors import IdentityError as IdentityError
from orchestrator.errors import StateDirError as StateDirError
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.sshconfig import config_options

KEY_TYPE = "ssh-ed25519"
USER_KEY_FILE = "cluster_ed25519"


@dataclass(frozen=True)
class KeyPair:
    """An OpenSSH-format private key and its one-line public key."""

    private: str
    public: str  # "ssh-ed25519 AAAA… comment"

    @property
    def public_blob(self) -> str:
        """`ssh-ed25519 AAAA…` without the comment (for known_hosts)."""
        return " ".join(self.public.split()[:2])


@dataclass(frozen=True)
class ClusterKeys:
    """The keys cvs made for a cluster: the user's and each host's, under `state_dir`."""

    user: KeyPair
    host_keys: Mapping[str, KeyPair]
    state_dir: Path

    @classmethod
    def load_or_create(cls, state_dir: Path, hosts: Iterable[str]) -> ClusterKeys:
        """The cluster's keys, creating the missing ones (safe against a concurrent caller).

        Raises StateDirError (one line naming the directory) when it cannot be
        written: a full disk, no permission.
        """
        state_dir = Path(state_dir).expanduser()
        try:
            return cls._load_or_create(state_dir, hosts)
        except OSError as exc:
            raise StateDirError(state_dir, exc) from None

    @classmethod
    def _load_or_create(cls, state_dir: Path, hosts: Iterable[str]) -> ClusterKeys:
        keys_dir = state_dir / "keys"
        hosts_dir = keys_dir / "hosts"
        for d in (state_dir, keys_dir, hosts_dir):
            _private_dir(d)
        user = _load_or_create_pair(keys_dir / USER_KEY_FILE, f"cvs-cluster@{state_dir.name}")
        host_keys: dict[str, KeyPair] = {}
        for host in hosts:
            if not HOST_NAME_RE.fullmatch(host) or "/" in host:
                raise ValueError(f"invalid host name {host!r}")
            host_keys[host] = _load_or_create_pair(
                hosts_dir / f"{host}_ed25519", f"cvs-host@{host}"
            )
        return cls(user=user, host_keys=MappingProxyType(host_keys), state_dir=state_dir)

    def host_key(self, host: str) -> KeyPair:
        try:
            return self.host_keys[host]
        except KeyError:
            raise KeyError(f"no sshd host key for {host!r}; load keys for every host") from None


def default_state_dir(cluster: ClusterConfig) -> Path:
    """cluster.state_dir (already resolved by the loader) or ~/.local/state/cvs/<name>."""
    if cluster.state_dir:
        return Path(cluster.state_dir).expanduser()
    return Path("~/.local/state/cvs").expanduser() / cluster.name


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir's mode is masked by the umask and ignored for an existing dir.
    if path.stat().st_uid == os.geteuid():
        path.chmod(0o700)


def _load_or_create_pair(private_path: Path, comment: str) -> KeyPair:
    public_path = private_path.with_name(private_path.name + ".pub")
    if not private_path.exists():
        key = asyncssh.generate_private_key(KEY_TYPE, comment=comment)
        _publish(private_path, key.export_private_key("openssh"))
    if private_path.stat().st_mode & 0o077:
        private_path.chmod(0o600)
    private_text = private_path.read_text()
    key = asyncssh.import_private_key(private_text)
    if key.algorithm.decode() != KEY_TYPE:
        raise ValueError(f"{private_path}: expected an {KEY_TYPE} key, found {key.algorithm!r}")
    public_text = key.export_public_key("openssh").decode().strip()
    if not public_path.exists() or public_path.read_text().strip() != public_text:
        # Derived from the private key, so rewriting it is always safe.
        _replace(public_path, public_text + "\n")
    return KeyPair(private=private_text, public=public_text)


def _write_temp(path: Path, data: str | bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    return Path(tmp)


def _publish(path: Path, data: str | bytes) -> None:
    """Create `path` atomically unless it exists; a concurrent creator's key wins."""
    tmp = _write_temp(path, data)
    try:
        # link() fails when `path` exists, unlike rename(): two processes
        # creating the same key end up agreeing on one of them.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _replace(path: Path, data: str) -> None:
    tmp = _write_temp(path, data)
    os.replace(tmp, path)


# --- host-key checking under `host_key_policy: strict` -------------------------

# An empty known_hosts: every host key is unknown, so every host is refused.
TRUST_NOTHING: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
_DISABLING_PATHS = frozenset({"/dev/null"})
_STRICT_OFF_RE = re.compile(
    r"\s*StrictHostKeyChecking(?:\s*=\s*|\s+)(no|off|accept-new)\s*(?:#.*)?", re.IGNORECASE
)


@dataclass(frozen=True)
class StrictKnownHosts:
    """What asyncssh gets as `known_hosts` under `strict`, and the ssh config
    settings that asked for less (reported as conflicts, never obeyed)."""

    known_hosts: str | list[str] | tuple[list[Any], list[Any], list[Any]]
    conflicts: tuple[str, ...] = ()


def strict_known_hosts(
    *,
    configured: str | None,
    use_ssh_config: bool,
    host: str,
    port: int,
    username: str | None = None,
    home: Path | None = None,
) -> StrictKnownHosts:
    """Always a real known_hosts under `strict`, whatever ~/.ssh/config says.

    The cluster file's `ssh.known_hosts` wins. Otherwise the user's ssh config
    may name known_hosts files (`UserKnownHostsFile`) and those are used, but
    `none` and `/dev/null` (which turn checking off, or make every key
    "unknown" and invite `StrictHostKeyChecking no`) are conflicts: reported,
    not obeyed, and ~/.ssh/known_hosts is used instead. `StrictHostKeyChecking
    no|off|accept-new` in the ssh config is reported the same way; cvs never
    obeys it (only the cluster file's `host_key_policy` relaxes checking).
    """
    home = home or Path(os.path.expanduser("~"))
    default = home / ".ssh" / "known_hosts"
    conflicts: list[str] = []
    if configured is not None:
        path = Path(configured).expanduser()
        return StrictKnownHosts(str(path) if path.is_file() else TRUST_NOTHING)
    candidates: list[str] = []
    if use_ssh_config:
        config_path = home / ".ssh" / "config"
        from_config = _ssh_config_known_hosts(host, port, username, config_path)
        if from_config is None:
            conflicts.append(
                f"{config_path}: UserKnownHostsFile none would turn host-key "
                f"checking off; host_key_policy strict checks {default} instead (set "
                "ssh.known_hosts in the cluster file, or host_key_policy accept-new/off "
                "there if that is what you mean)"
            )
        else:
            for entry in from_config:
                expanded = os.path.expanduser(entry)
                if expanded in _DISABLING_PATHS:
                    conflicts.append(
                        f"{config_path}: UserKnownHostsFile {entry} would make "
                        f"every host key unknown; host_key_policy strict checks {default} "
                        "instead"
                    )
                elif os.path.isfile(expanded):
                    candidates.append(expanded)
        if _strict_checking_disabled(config_path):
            conflicts.append(
                f"{config_path}: StrictHostKeyChecking is relaxed there; cvs does not obey "
                "it: host_key_policy strict refuses unknown and changed host keys (use "
                "host_key_policy accept-new or off in the cluster file to relax it)"
            )
    if not candidates and default.is_file():
        candidates.append(str(default))
    return StrictKnownHosts(candidates or TRUST_NOTHING, tuple(conflicts))


def _ssh_config_known_hosts(
    host: str, port: int, username: str | None, config_path: Path
) -> list[str] | None:
    """The UserKnownHostsFile entries ssh config gives `host` ([] when unset),
    None when it says `none`."""
    options = config_options(host, port, username, config=config_path)
    if options is None:
        return []
    known = options.known_hosts
    if known is None:
        return None
    if isinstance(known, str):
        return [known]
    if isinstance(known, list | tuple):
        return [str(k) for k in known if isinstance(k, str)]
    return []


def _strict_checking_disabled(config_path: Path) -> bool:
    # asyncssh ignores StrictHostKeyChecking; a textual scan is enough to report it.
    try:
        text = config_path.read_text(errors="replace")
    except OSError:
        return False
    return any(_STRICT_OFF_RE.fullmatch(line) for line in text.splitlines())


# --- the user's identity files ---------------------------------------------------


def load_identities(paths: Iterable[str]) -> list[asyncssh.SSHKeyPair]:
    """Key pairs from `ssh.identity_files` (with their `.pub`/`-cert.pub` when present)."""
    out: list[asyncssh.SSHKeyPair] = []
    for path in paths:
        try:
            out += asyncssh.load_keypairs([path])
        except asyncssh.KeyEncryptionError:
            raise IdentityError(
                f"ssh.identity_files: {path} is passphrase-protected: add it to ssh-agent "
                "and leave identity_files empty, or use a key without a passphrase"
            ) from None
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise IdentityError(
                f"ssh.identity_files: {path} is not a private key cvs can read ({exc})"
            ) from None
        except OSError as exc:
            raise IdentityError(
                f"ssh.identity_files: cannot read {path}: {exc.strerror or exc}"
            ) from None
    return out
