"""The cluster file's typed model (pydantic): every key, its type, its checks.

The cluster file is YAML (JSON is accepted, being YAML). Every model forbids
unknown keys so a typo is an error, never a silently ignored setting.

Loading (`load_cluster`) turns every problem into a `ConfigError` whose
message is one line naming the file and the key path or line:column; the CLI
prints it and exits 2.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from orchestrator.config.slurm import SlurmJob
from orchestrator.config.units import parse_size

Lifetime = Literal["no_launch", "per_run", "persistent", "per_job"]
HostKeyPolicy = Literal["strict", "accept-new", "off"]
PullPolicy = Literal["missing", "always", "never"]
Distribute = Literal["auto", "peers", "registry"]
SpreadTransport = Literal["relay", "direct"]

# Everything below reaches a remote command line, an ssh config or a docker
# argv: each is checked with `fullmatch` (a `$` anchor lets a trailing newline
# through, and a newline in an ssh config starts a new directive).
CONTAINER_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")
CLUSTER_NAME_RE = CONTAINER_NAME_RE
IMAGE_REF_RE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)
# A DNS-style host name (what cvs also uses as the in-container ssh alias).
DNS_NAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})")
# What may look like an IP literal; `ipaddress` then decides.
_IP_CHARS_RE = re.compile(r"[0-9A-Fa-f:.]+")
# Host names as the cluster file may write them: DNS names or IP literals.
HOST_NAME_RE = re.compile(r"[A-Za-z0-9_:](?:[A-Za-z0-9_.:-]{0,252})")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
USER_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,63}\$?")  # `al.ice@corp` (AD) too
_HOST_PORT_RE = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>[0-9]{1,5})"
)
REGISTRY_SERVER_RE = re.compile(
    r"(?:https?://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?"
)
# docker option values: no control characters, never read as another option.
DOCKER_VALUE_RE = re.compile(r"[^\x00-\x1f\x7f-][^\x00-\x1f\x7f]*")


def is_ip_literal(text: str) -> bool:
    if not _IP_CHARS_RE.fullmatch(text):
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_host_or_ip(text: str) -> bool:
    """A DNS-style host name or an IP literal (v4 or v6), nothing else."""
    if not isinstance(text, str):
        return False
    return is_ip_literal(text) or (DNS_NAME_RE.fullmatch(text) is not None and ":" not in text)


def split_host_port(text: str) -> tuple[str, int] | None:
    """`host:port` or `[v6]:port` -> (host, port); None when `text` has no port."""
    if not isinstance(text, str) or is_ip_literal(text):
        return None  # `fe80::1` is an address, not `fe80:` + port
    m = _HOST_PORT_RE.fullmatch(text)
    if m is None:
        return None
    host = m.group("v6") or m.group("host")
    return host, int(m.group("port"))


def _host_or_ip(what: str, v: str | None) -> str | None:
    if v is None:
        return v
    split = split_host_port(v)
    if split is not None:
        host, port = split
        raise ValueError(
            f"{what} {v!r} carries a port: write the address and the port apart "
            f"({what}: {host}, port: {port})"
        )
    if not is_host_or_ip(v):
        raise ValueError(
            f"invalid {what} {v!r}: expected a host name (letters, digits, '.', '-', '_') "
            "or an IP address"
        )
    return v


def _check_user(v: str | None) -> str | None:
    if v is not None and not USER_NAME_RE.fullmatch(v):
        raise ValueError(f"invalid user name {v!r}")
    return v


def _docker_values(v: list[str]) -> list[str]:
    for item in v:
        if not isinstance(item, str) or not DOCKER_VALUE_RE.fullmatch(item):
            raise ValueError(
                f"invalid value {item!r}: no control characters (newline, tab) and no leading '-'"
            )
    return v


# `docker exec -w`: an absolute path without control characters.
WORKDIR_RE = re.compile(r"/[^\x00-\x1f\x7f]*")
# A `docker exec -u` value: NAME, UID, NAME:GROUP or UID:GID.
CONTAINER_USER_RE = re.compile(
    r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?"
)


@dataclass(frozen=True)
class JumpHop:
    """One hop of `ssh.proxy_jump`; None is "not given" (ssh.user, port 22)."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and self.port else self.host
        user = f"{self.user}@" if self.user else ""
        return user + host + (f":{self.port}" if self.port else "")


def jump_hops(text: str) -> list[JumpHop]:
    """`[user@]host[:port],...` -> hops, first to last; ValueError names a bad hop."""
    hops = []
    for hop in text.split(","):
        user, _, rest = hop.rpartition("@")
        if user:
            _check_user(user)
        split = split_host_port(rest)
        host, port = split if split is not None else (rest, None)
        if not is_host_or_ip(host) or (port is not None and not 1 <= port <= 65535):
            raise ValueError(
                f"invalid proxy_jump hop {hop!r}: expected [user@]host[:port], comma-separated"
            )
        hops.append(JumpHop(host=host, user=user or None, port=port))
    return hops


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Marks a field the loader fills in, never written in a file (docs/cluster-file.md
# leaves it out; the loader refuses it in a file).
SET_BY_LOADER: dict[str, Any] = {"set_by_loader": True}


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(key):
            raise ValueError(f"invalid environment variable name {key!r}")
    return env


def _size_as_text(v: Any) -> Any:
    # A bare YAML number is a byte count; keep the field a string so every
    # consumer parses sizes the same way (parse_size).
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return v


def _check_size(v: str | None) -> str | None:
    if v is not None:
        parse_size(v)  # ValueError names the bad value and the expected form
    return v


class Limits(Model):
    """Operator caps on what a container may take on a host."""

    max_cpus: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Most CPUs a container may use (`docker run --cpus`); a request above it is "
        "clamped with a warning",
    )
    max_memory: str | None = Field(
        default=None,
        description="Most memory a container may use (`--memory`); a request above it is clamped",
    )
    max_pids: int | None = Field(
        default=None, ge=1, description="Most processes a container may run (`--pids-limit`)"
    )

    _size_in = field_validator("max_memory", mode="before")(_size_as_text)
    _size_ok = field_validator("max_memory")(_check_size)


class HostSpec(Model):
    """One host after hostlist expansion, with its per-host overrides."""

    name: str = Field(
        description="Host name, address or hostlist (`gpu[01-16]`); a hostlist applies the "
        "entry's other keys to every host it expands to"
    )
    address: str | None = Field(
        default=None,
        description="Where to connect (host name or IP; `10.0.0.5:2222` sets the port too); "
        "unset: the name",
    )
    port: int | None = Field(
        default=None, ge=1, le=65535, description="SSH port of this host; unset: `ssh.port`"
    )
    user: str | None = Field(default=None, description="SSH login user; unset: `ssh.user`")
    vpc_address: str | None = Field(
        default=None,
        description="Address the containers use to reach this host's container (MPI, "
        "in-container sshd); unset: the address",
    )
    limits: Limits | None = Field(
        default=None,
        description="Caps for this host, over the cluster's `limits` (same keys as `limits`)",
    )
    gpu_device_root: str | None = Field(
        default=None,
        description="Sandbox and tests only: the directory the GPU probe reads instead of `/` "
        "(`/dev/kfd`, `/dev/dri`, ...)",
    )

    @model_validator(mode="before")
    @classmethod
    def _address_port(cls, data: Any) -> Any:
        # `address: 10.0.0.5:2222` is parsed into address + port (never used
        # silently with port 22); a port given both ways must agree.
        if isinstance(data, dict) and isinstance(data.get("address"), str):
            split = split_host_port(data["address"])
            if split is not None:
                host, port = split
                if data.get("port") not in (None, port):
                    raise ValueError(
                        f"address {data['address']!r} says port {port} but port is "
                        f"{data['port']!r}: give the port once"
                    )
                data = {**data, "address": host, "port": port}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        split = split_host_port(v)
        if split is not None:
            host, port = split
            raise ValueError(
                f"host {v!r} carries a port: write it as a mapping "
                f"{{name: NAME, address: {host}, port: {port}}}"
            )
        if not is_host_or_ip(v):
            raise ValueError(
                f"invalid host name {v!r}: expected a host name (letters, digits, '.', '-', "
                "'_') or an IP address"
            )
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        return _host_or_ip("address", v)

    @field_validator("vpc_address")
    @classmethod
    def _vpc_address(cls, v: str | None) -> str | None:
        return _host_or_ip("vpc_address", v)

    _user_ok = field_validator("user")(_check_user)


class SSHConfig(Model):
    user: str | None = Field(
        default=None,
        description="SSH login user on every host; unset: ~/.ssh/config's User, else your "
        "local user name",
    )
    port: int = Field(default=22, ge=1, le=65535, description="SSH port on every host")
    identity_files: list[str] = Field(
        default_factory=list,
        description="Private keys to log in with (one path is accepted too); empty: the SSH "
        "agent and your default keys",
    )
    host_key_policy: HostKeyPolicy = Field(
        default="strict",
        description="strict: an unknown or changed host key is refused; accept-new: learn "
        'unknown keys; "off" (quoted): no check',
    )
    known_hosts: str | None = Field(
        default=None,
        description="known_hosts file; unset: the ssh config's UserKnownHostsFile, else "
        "~/.ssh/known_hosts",
    )
    connect_timeout: float = Field(
        default=10.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds for one connect attempt: TCP, SSH handshake and login",
    )
    connect_budget: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds for all of a host's connect attempts and the backoff between them "
        "(timeouts and resets are retried within it); unset: connect_timeout",
    )
    keepalive: float = Field(
        default=5.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds without a byte from a host before a keepalive is sent; a silent "
        "host is lost after keepalive x (keepalive_count + 1) s; 0: off",
    )
    keepalive_count: int = Field(
        default=3, ge=1, le=100, description="Unanswered keepalives after which a host is lost"
    )
    proxy_jump: str | None = Field(
        default=None,
        description="Jump hosts, `[user@]host[:port]`, comma-separated: opened once, every "
        "host's connection a channel of it",
    )
    use_ssh_config: bool = Field(
        default=True, description="Read ~/.ssh/config (HostName, User, IdentityFile, ProxyJump...)"
    )
    command_timeout: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="Default seconds for one remote command (a timeout given for a command "
        "overrides it)",
    )
    max_channels: int = Field(
        default=8,
        ge=1,
        le=64,
        description="Channels open at once on one connection (sshd's MaxSessions defaults to 10)",
    )
    connect_retries: int = Field(
        default=6,
        ge=0,
        le=50,
        description="Most retries of a reset connection within connect_budget",
    )

    _user_ok = field_validator("user")(_check_user)

    @field_validator("proxy_jump")
    @classmethod
    def _proxy_jump(cls, v: str | None) -> str | None:
        # [user@]host[:port], comma-separated: it reaches ssh's ProxyJump.
        if v is not None:
            jump_hops(v)
        return v

    @field_validator("identity_files", mode="before")
    @classmethod
    def _one_identity(cls, v: Any) -> Any:
        # `identity_files: ~/.ssh/id_ed25519` is the common case; accept it.
        return [v] if isinstance(v, str) else v


class Concurrency(Model):
    # Per sshd (SSHPool's `sshd_key`): entries sharing one (same address, an
    # alias's HostName, a ProxyCommand in ~/.ssh/config) share its cap; a jump
    # is one shared connection. Handshakes in flight fleet-wide are not
    # `hosts`: they adapt to what the coordinator completes (ssh/admission.py).
    handshakes: int = Field(
        default=10,
        ge=1,
        description="SSH handshakes in flight at once per sshd (an sshd refuses "
        "unauthenticated connections beyond its MaxStartups, 10 by default)",
    )
    hosts: int = Field(
        default=256,
        ge=1,
        description="Hosts worked on at once; the fleet size is safe: handshakes are admitted "
        "adaptively",
    )
    # ssh/workers/parent.py: when unset, workers only from WORKERS_FROM hosts on a
    # machine with WORKERS_MIN_CORES cores (on 2 cores they did not pay).
    workers: int | None = Field(
        default=None,
        ge=1,
        description="Coordinator processes sharing a large fan-out of commands on the hosts, "
        "each with its own connections; unset: one per core for 512 hosts or more on 4 "
        "cores or more, else one; 1: always one; above the cores: clamped, with a warning",
    )


class Registry(Model):
    username: str = Field(description="Registry user name")
    password_file: str = Field(
        description="Path on each host of a file holding the password (sent to `docker login "
        "--password-stdin`, never in argv)"
    )
    server: str | None = Field(
        default=None,
        description="Registry `host[:port]` or `https://host[:port][/path]`; unset: Docker Hub",
    )

    # All three reach `docker login` on the hosts: never read as an option there.
    _values_ok = field_validator("username", "password_file")(lambda v: _docker_values([v])[0])

    @field_validator("server")
    @classmethod
    def _server(cls, v: str | None) -> str | None:
        if v is None:
            return v
        m = REGISTRY_SERVER_RE.fullmatch(v)
        if m is None or not is_host_or_ip(m.group("host").strip("[]")):
            raise ValueError(
                f"invalid registry server {v!r}: expected host, host:port or "
                "https://host[:port][/path]"
            )
        return v


class Resources(Model):
    """What the container asks for (clamped by the operator's `limits`)."""

    cpus: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="CPUs (`--cpus`, a hard limit), clamped to `limits.max_cpus`",
    )
    memory: str | None = Field(
        default=None,
        description="Memory (`--memory`, a hard limit), clamped to `limits.max_memory`",
    )
    pids: int | None = Field(
        default=None, ge=1, description="Processes (`--pids-limit`), clamped to `limits.max_pids`"
    )
    shm_size: str | None = Field(default=None, description="Size of /dev/shm (`--shm-size`)")
    memory_reservation: str | None = Field(
        default=None, description="Soft memory limit (`--memory-reservation`)"
    )
    cpu_shares: int | None = Field(
        default=None, ge=2, description="Relative CPU weight (`--cpu-shares`), a soft limit"
    )

    _size_in = field_validator("memory", "shm_size", "memory_reservation", mode="before")(
        _size_as_text
    )
    _size_ok = field_validator("memory", "shm_size", "memory_reservation")(_check_size)


class GPURequest(Model):
    count: int | None = Field(
        default=None,
        ge=1,
        description="How many GPUs, the lowest-indexed that match; unset: every matching GPU",
    )
    type: str | None = Field(
        default=None, description="GPU model to match (`MI300X`, `H100`...); unset: any"
    )
    min_memory: str | None = Field(
        default=None, description="Least memory a GPU must have to match"
    )
    # config/gpu_devices.py
    allow_all_devices: bool = Field(
        default=False,
        description="Allow `devices` / `privileged` that expose GPUs beyond the selected ones "
        "(otherwise refused)",
    )

    _size_in = field_validator("min_memory", mode="before")(_size_as_text)
    _size_ok = field_validator("min_memory")(_check_size)


class SSHDConfig(Model):
    """The sshd inside each container, for MPI ranks to reach each other."""

    port: int = Field(
        default=2224,
        ge=1,
        le=65535,
        description="Port the in-container sshd listens on (differ per cluster on shared hosts "
        "with `network: host`); unset inside a Slurm job (per_run, per_job): one per job, "
        "20000 + job ID mod 10000",
    )
    enabled: Literal["auto", True, False] = Field(
        default="auto",
        description="Start the in-container sshd; auto: when the cluster has more than one host",
    )
    exec: bool = Field(
        default=True,
        description="Run commands in the containers (exec, suite steps) through this sshd when "
        "it runs, instead of `docker exec` (see docs/performance.md)",
    )


class MPIConfig(Model):
    """Open MPI between the containers (docs/mpi.md)."""

    slots: int | None = Field(
        default=None,
        description="Slots per host written in the MPI hostfile (at least 1); unset: the "
        "GPUs the host's container got (1 without GPUs)",
    )
    hostfile: str = Field(
        default="/etc/cvs/hostfile",
        description="Where the MPI hostfile is written in each container (an absolute path)",
    )

    @field_validator("slots")
    @classmethod
    def _slots(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(
                f"mpi.slots must be at least 1, got {v} (leave it out to use the GPUs "
                "each container gets)"
            )
        return v

    @field_validator("hostfile")
    @classmethod
    def _hostfile(cls, v: str) -> str:
        # It goes to the in-container installer's argv and into MPI command lines.
        if not re.fullmatch(r"/[A-Za-z0-9_./+-]*[A-Za-z0-9_+-]", v) or "/../" in f"{v}/":
            raise ValueError(
                f"mpi.hostfile must be an absolute path inside the container "
                f"(letters, digits, '_', '.', '+', '-'), got {v!r}: e.g. /etc/cvs/hostfile"
            )
        return v


# Keys of the container block renamed for what they mean with any runtime:
# old -> new. The old one is still read for one release, and reported.
DEPRECATED_CONTAINER_KEYS: dict[str, str] = {"docker_timeout": "runtime_timeout"}


def _renamed(data: dict[str, Any], renames: dict[str, str]) -> dict[str, Any]:
    """`data` with each old key under its new name (both given: an error),
    the old names used listed in `deprecated_keys`."""
    used = [old for old in renames if old in data]
    if not used:
        return data
    out = dict(data)
    for old in used:
        new = renames[old]
        if new in out:
            raise ValueError(f"container.{old} and container.{new} both given: keep {new}")
        out[new] = out.pop(old)
    out["deprecated_keys"] = tuple(f"{old} -> {renames[old]}" for old in used)
    return out


class ContainerConfig(Model):
    image: str = Field(
        description="Image reference (`rocm/cvs:7.0`, `registry:5000/team/x@sha256:...`)"
    )
    name: str | None = Field(
        default=None,
        description="Container name on every host; unset: derived from the cluster name (set "
        "it for persistent, so a tag bump does not orphan the containers)",
    )
    lifetime: Lifetime = Field(
        default="per_run",
        description="What `up` and `down` do: no_launch (use running containers only), per_run "
        "(fresh each run, removed after), persistent (kept between runs), per_job (inside a Slurm "
        "job: kept across invocations, removed when the job ends)",
    )
    pull: PullPolicy = Field(
        default="missing",
        description="When to pull the image: missing (when the host lacks it), always, never",
    )
    image_tar: str | None = Field(
        default=None,
        description="Path on each host of an image archive to `docker load` when the image is "
        "missing",
    )
    registry: Registry | None = Field(
        default=None, description="Registry login before a pull (the password never in argv)"
    )
    registry_tls_verify: bool = Field(
        default=True,
        description="false: the registry serves plain HTTP; podman's login and pull get "
        "`--tls-verify=false` (no host setting changes). podman only: docker reads that "
        "from its daemon's `insecure-registries`",
    )
    distribute: Distribute = Field(
        default="auto",
        description="How hosts lacking the image get it: registry (each pulls, or loads "
        "`image_tar`), peers (one host pulls or loads once, the others get it host to host, "
        "pipelined, image ID checked), auto (peers when two or more hosts lack it, else "
        "registry; a receiver its feeder cannot reach host to host runs its own pull or "
        "load, and is named). See docs/distribution.md",
    )
    spread_transport: SpreadTransport = Field(
        default="direct",
        description="How a peers spread moves the bytes: direct (host to host over the "
        "hosts' ssh with a key for this invocation only; a receiver its feeder cannot reach "
        "is relayed with distribute peers, fetches itself with auto, and is named), relay "
        "(every hop through cvs's own SSH connections). See docs/distribution.md",
    )
    start_timeout: float = Field(
        default=900.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds for the long steps of a start: login, load and pull together; "
        "`run`; the setup script",
    )
    runtime_timeout: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds one runtime call that should answer at once may take (inspect, "
        "start, rm, the probe): a frozen daemon is named after this. Formerly "
        "`docker_timeout` (still read, reported as deprecated)",
    )
    deprecated_keys: tuple[str, ...] = Field(
        default=(),
        exclude=True,
        description="Set by the loader: the deprecated keys the file used (old -> new)",
        json_schema_extra=SET_BY_LOADER,
    )
    network: str = Field(default="host", description="`docker run --network`")
    ipc: str | None = Field(
        default="host", description="`docker run --ipc`; unset: docker's default"
    )
    privileged: bool = Field(default=False, description="`docker run --privileged`")
    devices: list[str] = Field(
        default_factory=list,
        description="Devices to pass (`/dev/kfd`, `/dev/infiniband/*`); only those present on "
        "each host",
    )
    cap_add: list[str] = Field(default_factory=list, description="`docker run --cap-add` each")
    security_opt: list[str] = Field(
        default_factory=list, description="`docker run --security-opt` each"
    )
    group_add: list[str] = Field(default_factory=list, description="`docker run --group-add` each")
    ulimits: dict[str, str | int] = Field(
        default_factory=dict,
        description="`docker run --ulimit NAME=VALUE` each (`memlock: -1` is unlimited)",
    )
    volumes: list[str] = Field(
        default_factory=list, description="`docker run --volume` each (`/data:/data:ro`)"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of the container (`docker run`, from an env file on stdin, "
        "never argv)",
    )
    shm_size: str | None = Field(default=None, description="Size of /dev/shm (`--shm-size`)")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More `docker run` arguments, as given (the operator's escape hatch)",
    )
    setup_script: str | None = Field(
        default=None,
        description="Script run in each freshly launched container, as root; unset or empty: "
        "the packaged one (installs openssh-server)",
    )
    user: str | None = Field(
        default=None,
        description="Who commands and suite steps run as in the container (`docker exec -u`: "
        "NAME, UID, NAME:GROUP, UID:GID); unset: the image's USER",
    )
    sshd: SSHDConfig = Field(
        default_factory=SSHDConfig, description="The sshd in each container, for MPI ranks"
    )
    mpi: MPIConfig = Field(
        default_factory=MPIConfig, description="The MPI hostfile written in each container"
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="What the container asks for, clamped by `limits`",
    )
    gpus: Literal["all"] | GPURequest | None = Field(
        default=None,
        description="GPUs for the container: `all`, or a request (below); unset: none asked for",
    )
    # docs/design.md, "Runtimes".
    runtime: Literal["docker", "podman"] = Field(
        default="docker",
        description="Container runtime on every host: docker (plain, else `sudo -n`) or podman "
        "(as root, else `sudo -n`)",
    )
    rootless: bool = Field(
        default=False,
        description="podman only: the login user's own rootless podman, never sudo",
    )
    cdi: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="GPUs through CDI: auto (podman, when the host's CDI specs cover each GPU), "
        "always (CDI or refuse), never (device nodes)",
    )
    # The setup script as read when the cluster file loaded (path, bytes): a
    # script removed or made unreadable later cannot fail a host midway.
    _setup_script_loaded: tuple[str, bytes] | None = PrivateAttr(default=None)

    @property
    def loaded_setup_script(self) -> tuple[str, bytes] | None:
        """(path, content) read at load time; None when built in code or not checked."""
        return self._setup_script_loaded

    def with_setup_script(self, path: str, content: bytes) -> ContainerConfig:
        """A copy carrying the script read at load time."""
        copy = self.model_copy()
        copy._setup_script_loaded = (path, content)
        return copy

    @model_validator(mode="before")
    @classmethod
    def _legacy_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = _renamed(data, DEPRECATED_CONTAINER_KEYS)
            for key in ("enabled", "launch"):
                if key in data:
                    raise ValueError(
                        f"legacy key 'container.{key}' is no longer supported: remove it and set "
                        "'container.lifetime' to no_launch (use running containers only), "
                        "per_run (start fresh each run, remove after) or persistent "
                        "(keep containers between runs)"
                    )
        return data

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_REF_RE.fullmatch(v):
            raise ValueError(f"invalid image reference {v!r}")
        return v

    @field_validator("name")
    @classmethod
    def _cname(cls, v: str | None) -> str | None:
        if v is not None and not CONTAINER_NAME_RE.fullmatch(v):
            raise ValueError(
                f"invalid container name {v!r} (letters, digits, '_', '.', '-'; "
                "must start with a letter or digit)"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        # `docker run` gets these from an env file on its stdin (never argv),
        # whose format is one `KEY=VALUE` per line.
        for key, value in v.items():
            if "\n" in value or "\r" in value:
                raise ValueError(
                    f"{key}: a container env value cannot contain a line break "
                    "(docker reads it from an env file); use the cluster's `env` instead"
                )
        return _check_env(v)

    @field_validator("network", "ipc")
    @classmethod
    def _docker_value(cls, v: str | None) -> str | None:
        if v is not None:
            _docker_values([v])
        return v

    _lists_ok = field_validator("devices", "cap_add", "security_opt", "group_add", "volumes")(
        _docker_values
    )

    @field_validator("ulimits")
    @classmethod
    def _ulimits(cls, v: dict[str, str | int]) -> dict[str, str | int]:
        # `--ulimit KEY=VALUE` is one argv item: a value may start with '-' (-1).
        for key, limit in v.items():
            if not ENV_NAME_RE.fullmatch(key) or re.search(r"[\x00-\x1f\x7f]", str(limit)):
                raise ValueError(f"invalid ulimit {key!r}: {limit!r}")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: list[str]) -> list[str]:
        # The operator's escape hatch: options are expected, control characters are not.
        for arg in v:
            if re.search(r"[\x00-\x1f\x7f]", arg):
                raise ValueError(f"invalid extra_args item {arg!r}: control characters")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not CONTAINER_USER_RE.fullmatch(v):
            raise ValueError(f"invalid container user {v!r} (NAME, UID, NAME:GROUP or UID:GID)")
        return v

    _size_in = field_validator("shm_size", mode="before")(_size_as_text)
    _size_ok = field_validator("shm_size")(_check_size)

    @model_validator(mode="after")
    def _slots_fit_cpus(self) -> ContainerConfig:
        cpus = self.resources.cpus
        slots = self.mpi.slots
        if slots is not None and cpus is not None and slots > cpus:
            raise ValueError(
                f"mpi.slots {slots} is more than the container's CPUs (resources.cpus "
                f"{cpus:g}): lower mpi.slots or raise resources.cpus"
            )
        return self

    @model_validator(mode="after")
    def _tls_verify_is_podman(self) -> ContainerConfig:
        if not self.registry_tls_verify and self.runtime != "podman":
            raise ValueError(
                "registry_tls_verify: false needs runtime: podman (docker has no such flag: "
                "a plain-HTTP registry goes into each daemon's `insecure-registries`, a host "
                "setting cvs does not change); remove the key"
            )
        return self

    @model_validator(mode="after")
    def _rootless_is_podman(self) -> ContainerConfig:
        if self.rootless and self.runtime != "podman":
            raise ValueError(
                "rootless: true needs runtime: podman (cvs drives rootless containers "
                "through the login user's podman; rootless docker is not supported)"
            )
        return self


HostEntry = Annotated[str | HostSpec, Field(union_mode="left_to_right")]


class ClusterConfig(Model):
    """The whole cluster file, hosts already expanded from hostlists."""

    name: str = Field(
        default="cvs",
        description="The cluster's name: its state directory and, in container labels, its "
        "identity",
    )
    hosts: list[HostSpec] = Field(
        description="Host names, addresses, hostlists (`gpu[01-16]`) or mappings (below); or "
        "`{from: slurm}` for the Slurm allocation's nodes"
    )
    head: str | None = Field(
        default=None, description="The head host (MPI steps, `hosts: head`); unset: the first"
    )
    ssh: SSHConfig = Field(default_factory=SSHConfig, description="How cvs reaches the hosts")
    concurrency: Concurrency = Field(
        default_factory=Concurrency, description="How many hosts and handshakes at once"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Exported for every command on every host; values go over stdin and are "
        "treated as secrets",
    )
    output_tail: str = Field(
        default="1Mi",
        description="Output kept in results per host and stream, the last this many bytes (the "
        "rest is streamed, and the run's logs keep all)",
    )
    limits: Limits | None = Field(
        default=None, description="Operator caps on every host's container (below)"
    )
    container: ContainerConfig | None = Field(
        default=None,
        description="The named container per host; unset: commands run on the hosts themselves",
    )
    state_dir: str | None = Field(
        default=None,
        description="Where this machine keeps the cluster's keys (MPI key pair, container host "
        "keys); unset: ~/.local/state/cvs/<name>",
    )
    source: str | None = Field(
        default=None,
        description="Set by the loader: the directory of the file",
        json_schema_extra=SET_BY_LOADER,
    )
    source_file: str | None = Field(
        default=None,
        description="Set by the loader: the file itself, absolute (the cluster's identity in "
        "labels when `name` is the default)",
        json_schema_extra=SET_BY_LOADER,
    )
    cvs_notes: list[str] = Field(
        default_factory=list,
        description="Set by the CVS-JSON import: what CVS's own rules put into effect, for "
        "validation's report",
        json_schema_extra=SET_BY_LOADER,
    )
    slurm: SlurmJob | None = Field(
        default=None,
        description="Set by the loader when the hosts come from a running Slurm job: its ID, "
        "nodes, their addresses and the GPU indices it holds on each",
        json_schema_extra=SET_BY_LOADER,
    )

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    _tail_in = field_validator("output_tail", mode="before")(_size_as_text)
    _tail_ok = field_validator("output_tail")(_check_size)

    @field_validator("name")
    @classmethod
    def _cluster_name(cls, v: str) -> str:
        # It names the state directory (~/.local/state/cvs/<name>) and goes into
        # container labels: one path component, no control characters.
        if not CLUSTER_NAME_RE.fullmatch(v):
            raise ValueError(
                f"invalid cluster name {v!r} (letters, digits, '_', '.', '-'; at most 128; "
                "must start with a letter or digit)"
            )
        return v

    @model_validator(mode="after")
    def _hosts_consistent(self) -> ClusterConfig:
        # The loader reports these with file positions first; this keeps a
        # ClusterConfig built in code (tests, the sandbox) just as consistent.
        if not self.hosts:
            raise ValueError("the host list is empty")
        seen: set[str] = set()
        for h in self.hosts:
            if h.name in seen:
                raise ValueError(f"duplicate host {h.name!r}")
            seen.add(h.name)
        if self.head is not None and self.head not in seen:
            raise ValueError(f"head {self.head!r} is not one of the hosts")
        return self

    @property
    def head_host(self) -> HostSpec:
        name = self.head or self.hosts[0].name
        return next(h for h in self.hosts if h.name == name)

    def host(self, name: str) -> HostSpec:
        """The host named `name`, in O(1): the connect path asks once per host,
        and a scan made a 5000-host fan-out quadratic (0.1 ms a call at 3000)."""
        return self._host_index()[name]

    def _host_index(self) -> dict[str, HostSpec]:
        # Kept in the instance's __dict__ beside the fields, as functools'
        # cached_property does (pydantic compares fields only, so equality is
        # untouched). Keyed by the list's identity and length: a model_copy that
        # replaces `hosts` (or a caller that appends) gets a fresh index.
        cached = self.__dict__.get("_hosts_by_name")
        if cached is None or cached[0] is not self.hosts or cached[1] != len(self.hosts):
            cached = (self.hosts, len(self.hosts), {h.name: h for h in self.hosts})
            self.__dict__["_hosts_by_name"] = cached
        index: dict[str, HostSpec] = cached[2]
        return index
