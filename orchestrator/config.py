"""Cluster file -> typed model.

The cluster file is YAML (JSON is accepted, being YAML). Every model forbids
unknown keys so a typo is an error, never a silently ignored setting.

Loading (`load_cluster`) turns every problem into a `ConfigError` whose
message is one line naming the file and the key path or line:column; the CLI
prints it and exits 2.
"""

from __future__ import annotations

import difflib
import getpass
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.documents import (
    ConfigError,
    Located,
    describe_value,
    first_problem,
    one_line,
    parse_document,
    read_document_text,
    validation_lines,
)
from orchestrator.hostlist import HostlistError, expand_hostlist
from orchestrator.units import parse_size

Lifetime = Literal["no_launch", "per_run", "persistent"]
HostKeyPolicy = Literal["strict", "accept-new", "off"]
PullPolicy = Literal["missing", "always", "never"]

# Container and image names reach remote command lines (quoted, but still):
# restrict them to what docker itself accepts so nothing odd gets that far.
CONTAINER_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
IMAGE_REF_RE = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for key in env:
        if not ENV_NAME_RE.match(key):
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

    max_cpus: float | None = Field(default=None, gt=0)
    max_memory: str | None = None
    max_pids: int | None = Field(default=None, ge=1)

    _size_in = field_validator("max_memory", mode="before")(_size_as_text)
    _size_ok = field_validator("max_memory")(_check_size)


class HostSpec(Model):
    """One host after hostlist expansion, with its per-host overrides."""

    name: str
    address: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    vpc_address: str | None = None
    limits: Limits | None = None
    # Sandbox/testing only: where the probe looks for /dev/kfd, /dev/dri, ...
    gpu_device_root: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not HOST_NAME_RE.match(v):
            raise ValueError(f"invalid host name {v!r}")
        return v


class SSHConfig(Model):
    user: str | None = None
    port: int = Field(default=22, ge=1, le=65535)
    identity_files: list[str] = Field(default_factory=list)
    host_key_policy: HostKeyPolicy = "strict"
    known_hosts: str | None = None
    connect_timeout: float = Field(default=10.0, gt=0)
    keepalive: float = Field(default=30.0, ge=0)
    proxy_jump: str | None = None
    use_ssh_config: bool = True
    # Default timeout for one remote command, seconds.
    command_timeout: float = Field(default=600.0, gt=0)
    # Channels open at once on one connection; sshd's MaxSessions defaults to 10.
    max_channels: int = Field(default=8, ge=1, le=64)
    connect_retries: int = Field(default=6, ge=0, le=50)

    @field_validator("identity_files", mode="before")
    @classmethod
    def _one_identity(cls, v: Any) -> Any:
        # `identity_files: ~/.ssh/id_ed25519` is the common case; accept it.
        return [v] if isinstance(v, str) else v


class Concurrency(Model):
    # Handshakes in flight at once (sshd's MaxStartups defaults to 10:30:100).
    handshakes: int = Field(default=10, ge=1)
    # Hosts worked on at once.
    hosts: int = Field(default=256, ge=1)


class Registry(Model):
    username: str
    # A path on each host; the password goes to `docker login --password-stdin`.
    password_file: str
    server: str | None = None


class Resources(Model):
    """What the container asks for (clamped by the operator's `limits`)."""

    cpus: float | None = Field(default=None, gt=0)
    memory: str | None = None
    pids: int | None = Field(default=None, ge=1)
    shm_size: str | None = None
    memory_reservation: str | None = None
    cpu_shares: int | None = Field(default=None, ge=2)

    _size_in = field_validator("memory", "shm_size", "memory_reservation", mode="before")(
        _size_as_text
    )
    _size_ok = field_validator("memory", "shm_size", "memory_reservation")(_check_size)


class GPURequest(Model):
    count: int | None = Field(default=None, ge=1)
    type: str | None = None
    min_memory: str | None = None

    _size_in = field_validator("min_memory", mode="before")(_size_as_text)
    _size_ok = field_validator("min_memory")(_check_size)


class SSHDConfig(Model):
    """The sshd inside each container, for MPI ranks to reach each other."""

    port: int = Field(default=2224, ge=1, le=65535)
    # auto: start it when the cluster has more than one host.
    enabled: Literal["auto", True, False] = "auto"


class MPIConfig(Model):
    slots: int = Field(default=1, ge=1)
    hostfile: str = "/etc/cvs/hostfile"


class ContainerConfig(Model):
    image: str
    name: str | None = None
    lifetime: Lifetime = "per_run"
    pull: PullPolicy = "missing"
    image_tar: str | None = None
    registry: Registry | None = None
    start_timeout: float = Field(default=900.0, gt=0)
    network: str = "host"
    ipc: str | None = "host"
    privileged: bool = False
    devices: list[str] = Field(default_factory=list)
    cap_add: list[str] = Field(default_factory=list)
    security_opt: list[str] = Field(default_factory=list)
    group_add: list[str] = Field(default_factory=list)
    ulimits: dict[str, str | int] = Field(default_factory=dict)
    volumes: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    shm_size: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    setup_script: str | None = None
    sshd: SSHDConfig = Field(default_factory=SSHDConfig)
    mpi: MPIConfig = Field(default_factory=MPIConfig)
    resources: Resources = Field(default_factory=Resources)
    gpus: Literal["all"] | GPURequest | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
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
        if not IMAGE_REF_RE.match(v):
            raise ValueError(f"invalid image reference {v!r}")
        return v

    @field_validator("name")
    @classmethod
    def _cname(cls, v: str | None) -> str | None:
        if v is not None and not CONTAINER_NAME_RE.match(v):
            raise ValueError(
                f"invalid container name {v!r} (letters, digits, '_', '.', '-'; "
                "must start with a letter or digit)"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    _size_in = field_validator("shm_size", mode="before")(_size_as_text)
    _size_ok = field_validator("shm_size")(_check_size)


HostEntry = Annotated[str | HostSpec, Field(union_mode="left_to_right")]


class ClusterConfig(Model):
    """The whole cluster file, hosts already expanded from hostlists."""

    name: str = "cvs"
    hosts: list[HostSpec]
    head: str | None = None
    ssh: SSHConfig = Field(default_factory=SSHConfig)
    concurrency: Concurrency = Field(default_factory=Concurrency)
    env: dict[str, str] = Field(default_factory=dict)
    limits: Limits | None = None
    container: ContainerConfig | None = None
    # Where local state lives (per-cluster MPI key pair, locks): relative to the
    # cluster file unless absolute. Default: ~/.local/state/cvs/<name>.
    state_dir: str | None = None
    # The directory of the file this was loaded from (set by the loader).
    source: str | None = None

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

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
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


# --------------------------------------------------------------------------
# Loading: file -> raw data (with positions) -> expanded hosts -> model.
# --------------------------------------------------------------------------


# ---- hosts -----------------------------------------------------------------

_HOST_OVERRIDES = tuple(f for f in HostSpec.model_fields if f != "name")


def _expand_hosts(raw_hosts: Any, located: Located) -> tuple[list[Any], list[int]]:
    """Expanded host entries, and for each the index of the entry it came from."""
    if isinstance(raw_hosts, str):
        raw_hosts = [raw_hosts]
        single = True
    else:
        single = False
    if raw_hosts is None or (isinstance(raw_hosts, list) and not raw_hosts):
        raise ConfigError(located.error(["hosts"], "the host list is empty"))
    if not isinstance(raw_hosts, list):
        raise ConfigError(
            located.error(["hosts"], f"expected a list of hosts, got {describe_value(raw_hosts)}")
        )
    entries: list[Any] = []
    origins: list[int] = []
    for index, item in enumerate(raw_hosts):
        path: list[Any] = ["hosts"] if single else ["hosts", index]
        if isinstance(item, str):
            expr, overrides = item, {}
        elif isinstance(item, dict):
            if "name" not in item:
                raise ConfigError(located.error(path, "a host mapping needs a 'name'"))
            expr = item["name"]
            if not isinstance(expr, str):
                raise ConfigError(
                    located.error(
                        [*path, "name"], f"expected a host name, got {describe_value(expr)}"
                    )
                )
            overrides = {k: v for k, v in item.items() if k != "name"}
        else:
            raise ConfigError(
                located.error(
                    path,
                    f"expected a host name, address, hostlist or a mapping with 'name', "
                    f"got {describe_value(item)}",
                )
            )
        try:
            names = expand_hostlist(expr)
        except HostlistError as exc:
            name_path = [*path, "name"] if isinstance(item, dict) else path
            raise ConfigError(located.error(name_path, f"bad hostlist: {exc}")) from None
        for name in names:
            entries.append({"name": name, **overrides})
            origins.append(index)
    seen: dict[str, int] = {}
    for index, entry in zip(origins, entries, strict=True):
        name = entry["name"]
        if name in seen:
            first = seen[name]
            path = ["hosts"] if single else ["hosts", index]
            also = "" if first == index else f" (also in hosts[{first}])"
            raise ConfigError(located.error(path, f"duplicate host {name!r}{also}"))
        seen[name] = index
    return entries, origins


# ---- CVS cluster JSON -------------------------------------------------------

_CVS_TOP_KEYS = {
    "node_dict",
    "username",
    "priv_key_file",
    "head_node_dict",
    "env_vars",
    "container",
}
# CVS keys that mean nothing to this orchestrator (BMC access, rack maps, home
# mount name for CVS's own scripts): accepted and ignored.
_CVS_IGNORED_KEYS = {"home_mount_dir_name", "orchestrator", "racks"}
_CVS_NODE_KEYS = {"bmc_ip", "vpc_ip", "rack_id"}
# CVS's container.runtime.args names -> ours. CVS applies its own defaults
# (privileged, /dev/kfd, IPC_LOCK, memlock...) for args a file leaves out;
# those are NOT applied here: what the file says is what runs.
_CVS_RUNTIME_ARGS = {
    "devices": "devices",
    "capabilities": "cap_add",
    "cap_add": "cap_add",
    "security_opts": "security_opt",
    "security_opt": "security_opt",
    "groups": "group_add",
    "group_add": "group_add",
    "ulimits": "ulimits",
    "environment": "env",
    "env": "env",
    "network_mode": "network",
    "network": "network",
    "ipc_mode": "ipc",
    "ipc": "ipc",
    "privileged": "privileged",
    "volumes": "volumes",
    "shm_size": "shm_size",
    "extra_args": "extra_args",
}
_CVS_PLACEHOLDER_USER = "{user-id}"


def is_cvs_cluster(data: Any) -> bool:
    """A CVS cluster JSON is recognised by its top-level `node_dict`."""
    return isinstance(data, dict) and "node_dict" in data


def _cvs_comment(key: Any) -> bool:
    # CVS documents its files with `_comment`, `_vpc_comment`, `_env_vars_example`...
    return isinstance(key, str) and key.startswith("_")


def _replace_user(value: Any, user: str) -> Any:
    if isinstance(value, str):
        return value.replace(_CVS_PLACEHOLDER_USER, user)
    if isinstance(value, dict):
        return {_replace_user(k, user): _replace_user(v, user) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_user(v, user) for v in value]
    return value


def _unknown(located: Located, path: list[Any], key: Any, known: set[str]) -> ConfigError:
    close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(located.error([*path, key], f"unknown key in a CVS cluster file{hint}"))


def _cvs_container(block: Any, located: Located) -> Any:
    if not isinstance(block, dict):
        return block  # the model reports the type
    out = {k: v for k, v in block.items() if not _cvs_comment(k) and k != "runtime"}
    runtime = block.get("runtime")
    if runtime is None:
        return out
    if not isinstance(runtime, dict):
        raise ConfigError(
            located.error(
                ["container", "runtime"], f"expected a mapping, got {describe_value(runtime)}"
            )
        )
    for key in runtime:
        if not _cvs_comment(key) and key not in ("name", "args"):
            raise _unknown(located, ["container", "runtime"], key, {"name", "args"})
    name = runtime.get("name", "docker")
    if name != "docker":
        raise ConfigError(
            located.error(
                ["container", "runtime", "name"], f"only 'docker' is supported, got {name!r}"
            )
        )
    args = runtime.get("args") or {}
    if not isinstance(args, dict):
        raise ConfigError(
            located.error(
                ["container", "runtime", "args"], f"expected a mapping, got {describe_value(args)}"
            )
        )
    for key, value in args.items():
        if _cvs_comment(key):
            continue
        if key not in _CVS_RUNTIME_ARGS:
            raise _unknown(located, ["container", "runtime", "args"], key, set(_CVS_RUNTIME_ARGS))
        ours = _CVS_RUNTIME_ARGS[key]
        if ours == "ulimits" and isinstance(value, list):
            # CVS writes ulimits as ["memlock=-1", ...]; ours is a mapping.
            limits: dict[str, Any] = {}
            for item in value:
                if not isinstance(item, str) or "=" not in item:
                    raise ConfigError(
                        located.error(
                            ["container", "runtime", "args", "ulimits"],
                            f"expected NAME=VALUE entries, got {describe_value(item)}",
                        )
                    )
                limit, _, amount = item.partition("=")
                limits[limit] = amount
            value = limits
        if ours in out and key != ours:
            raise ConfigError(
                located.error(
                    ["container", "runtime", "args", key],
                    f"conflicts with container.{ours} (set it in one place)",
                )
            )
        out[ours] = value
    return out


def _from_cvs(data: dict[str, Any], located: Located) -> dict[str, Any]:
    data = _replace_user(data, getpass.getuser())
    located = Located(located.source, None)  # positions don't survive the rewrite
    for key in data:
        if _cvs_comment(key) or key in _CVS_TOP_KEYS or key in _CVS_IGNORED_KEYS:
            continue
        raise _unknown(located, [], key, _CVS_TOP_KEYS | _CVS_IGNORED_KEYS)
    nodes = data["node_dict"]
    if not isinstance(nodes, dict):
        raise ConfigError(
            located.error(
                ["node_dict"], f"expected a mapping of hosts, got {describe_value(nodes)}"
            )
        )
    hosts: list[dict[str, Any]] = []
    for name, node in nodes.items():
        if _cvs_comment(name):
            continue
        entry: dict[str, Any] = {"name": name}
        if node is None:
            node = {}
        if not isinstance(node, dict):
            raise ConfigError(
                located.error(
                    ["node_dict", name], f"expected a mapping, got {describe_value(node)}"
                )
            )
        for key in node:
            if not _cvs_comment(key) and key not in _CVS_NODE_KEYS:
                raise _unknown(located, ["node_dict", name], key, _CVS_NODE_KEYS)
        vpc = node.get("vpc_ip")
        # CVS says "set the same as the main host IP" when there is no VPC.
        if isinstance(vpc, str) and vpc.strip() and vpc not in ("NA", name):
            entry["vpc_address"] = vpc
        elif vpc is not None and not isinstance(vpc, str):
            entry["vpc_address"] = vpc  # the model reports the type
        hosts.append(entry)
    out: dict[str, Any] = {"hosts": hosts}
    ssh: dict[str, Any] = {}
    if data.get("username") is not None:
        ssh["user"] = data["username"]
    if data.get("priv_key_file") is not None:
        ssh["identity_files"] = [data["priv_key_file"]]
    if ssh:
        out["ssh"] = ssh
    head = data.get("head_node_dict")
    if isinstance(head, dict):
        mgmt = head.get("mgmt_ip")
        if mgmt is not None:
            out["head"] = mgmt
    elif head is not None:
        raise ConfigError(
            located.error(["head_node_dict"], f"expected a mapping, got {describe_value(head)}")
        )
    if data.get("env_vars") is not None:
        out["env"] = data["env_vars"]
    container = data.get("container")
    orchestrator = data.get("orchestrator", "container")
    if container is not None and orchestrator != "baremetal":
        out["container"] = _cvs_container(container, located)
    return out


# ---- paths -----------------------------------------------------------------


def _resolve(path: str, base_dir: Path) -> str:
    p = Path(os.path.expanduser(path))
    if not p.is_absolute():
        p = base_dir / p
    return os.path.normpath(str(p))


def _resolve_paths(
    cluster: ClusterConfig, base_dir: Path, located: Located, check_files: bool
) -> ClusterConfig:
    identity: list[str] = []
    for index, path in enumerate(cluster.ssh.identity_files):
        key = ["ssh", "identity_files", index]
        if not path.strip():
            raise ConfigError(located.error(key, "empty path"))
        resolved = _resolve(path, base_dir)
        if check_files and not os.path.isfile(resolved):
            raise ConfigError(located.error(key, f"identity file not found: {resolved}"))
        identity.append(resolved)
    ssh_update: dict[str, Any] = {"identity_files": identity}
    if cluster.ssh.known_hosts:
        ssh_update["known_hosts"] = _resolve(cluster.ssh.known_hosts, base_dir)
    update: dict[str, Any] = {"ssh": cluster.ssh.model_copy(update=ssh_update)}
    if cluster.state_dir:
        update["state_dir"] = _resolve(cluster.state_dir, base_dir)
    container = cluster.container
    if container is not None:
        script = container.setup_script
        if script is not None and not script.strip():
            script = None  # empty means the packaged default
        elif script is not None:
            script = _resolve(script, base_dir)
            if check_files and not os.path.isfile(script):
                raise ConfigError(
                    located.error(
                        ["container", "setup_script"], f"setup script not found: {script}"
                    )
                )
        update["container"] = container.model_copy(update={"setup_script": script})
    return cluster.model_copy(update=update)


# ---- entry points ----------------------------------------------------------


def cluster_from_data(
    data: Any, source: str, base_dir: Path, *, check_files: bool = True
) -> ClusterConfig:
    """Validate already-parsed cluster data (a YAML/JSON document)."""
    located = Located(source, data)
    if data is None:
        raise ConfigError(f"{source}: the file is empty (expected a mapping with 'hosts')")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of keys (hosts, ssh, container, ...), "
            f"got {describe_value(data)}"
        )
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(
                located.error([key], f"keys must be strings, got {describe_value(key)}")
            )
    if is_cvs_cluster(data):
        data = _from_cvs(data, located)
        located = Located(source, None)
    else:
        # `x-...` top-level keys are free for YAML anchors to hang on (the
        # docker compose convention): `x-caps: &caps {max_cpus: 8}`.
        data = {k: v for k, v in data.items() if not k.startswith("x-")}
    if "source" in data:
        raise ConfigError(
            located.error(["source"], "is set by the loader (the file's directory); remove it")
        )
    if "hosts" not in data:
        raise ConfigError(f"{source}: hosts: required key is missing")
    entries, origins = _expand_hosts(data["hosts"], located)
    raw_single = isinstance(data["hosts"], str)
    document = {**data, "hosts": entries}
    head = data.get("head")
    if head is None:
        first = entries[0].get("name")
        document["head"] = first
    elif isinstance(head, str) and head not in {e["name"] for e in entries}:
        raise ConfigError(located.error(["head"], f"{head!r} is not one of the hosts"))
    document["source"] = str(base_dir)

    def user_path(path: list[Any]) -> list[Any]:
        # hosts[k] of the expanded list -> hosts[i] as written in the file.
        if (
            len(path) >= 2
            and path[0] == "hosts"
            and isinstance(path[1], int)
            and 0 <= path[1] < len(origins)
        ):
            raw_index = origins[path[1]]
            return ["hosts"] if raw_single else ["hosts", raw_index, *path[2:]]
        return path

    try:
        cluster = ClusterConfig.model_validate(document)
    except ValidationError as exc:
        lines = validation_lines(exc.errors(include_url=False), located, user_path, ClusterConfig)
        raise first_problem(lines) from None
    return _resolve_paths(cluster, base_dir, located, check_files)


def parse_cluster(
    text: str, source: str, base_dir: Path, *, check_files: bool = True
) -> ClusterConfig:
    """Parse cluster-file text. `source` names the file in messages; relative
    paths in it resolve against `base_dir`. Raises ConfigError only."""
    try:
        data = parse_document(text, source)
        return cluster_from_data(data, source, Path(base_dir), check_files=check_files)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except Exception as exc:  # any parser/validator surprise is still a config problem
        raise ConfigError(f"{source}: {one_line(f'{type(exc).__name__}: {exc}')}") from None


def load_cluster(path: str | Path, *, check_files: bool = True) -> ClusterConfig:
    """Load and validate a cluster file (YAML, JSON, or CVS cluster JSON).

    `check_files=False` skips existence checks of identity files and the
    setup script (`cvs validate --no-check-files`, samples on another box).
    """
    source = str(path)
    text = read_document_text(source, "cluster file")
    base_dir = Path(os.path.expanduser(source)).resolve().parent
    return parse_cluster(text, source, base_dir, check_files=check_files)


# ---- derived views -----------------------------------------------------------


def _image_basename(image: str) -> str:
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def container_name(cluster: ClusterConfig) -> str:
    """The container's name on every host: explicit, or `cvs-<user>-<image>`.

    The user is the SSH login user when the file sets one (the same on every
    operator's machine), else the local user.
    """
    if cluster.container is None:
        raise ConfigError("the cluster file has no container block")
    if cluster.container.name:
        return cluster.container.name
    user = cluster.ssh.user or getpass.getuser()
    raw = f"cvs-{user}-{_image_basename(cluster.container.image)}"
    name = re.sub(r"[^a-zA-Z0-9_.-]+", "-", raw)[:128]
    if not CONTAINER_NAME_RE.match(name):  # cannot happen: starts with "cvs"
        raise ConfigError(f"cannot derive a container name from {raw!r}; set container.name")
    return name


def _caps_hosts(cluster: ClusterConfig) -> list[str]:
    """Hosts on which nothing caps the container (no hard request, no limit)."""
    container = cluster.container
    if container is None:
        return []
    r = container.resources
    if r.cpus is not None or r.memory is not None or r.pids is not None:
        return []

    def capped(limits: Limits | None) -> bool:
        return limits is not None and any(
            v is not None for v in (limits.max_cpus, limits.max_memory, limits.max_pids)
        )

    if capped(cluster.limits):
        return []
    return [h.name for h in cluster.hosts if not capped(h.limits)]


def cluster_warnings(cluster: ClusterConfig) -> list[str]:
    """Things that load fine but are probably not what the operator wants."""
    out: list[str] = []
    container = cluster.container
    if container is not None and container.lifetime == "persistent" and not container.name:
        out.append(
            "container.lifetime is persistent but container.name is not set: the name is "
            f"derived from the image ({container_name(cluster)}), so a tag bump would "
            "silently orphan the old container; set container.name"
        )
    uncapped = _caps_hosts(cluster)
    if uncapped and len(uncapped) == len(cluster.hosts):
        out.append("no resource caps: containers may take the whole host")
    elif uncapped:
        shown = ", ".join(uncapped[:5]) + (" ..." if len(uncapped) > 5 else "")
        out.append(
            f"no resource caps on {len(uncapped)} host(s) ({shown}): "
            "containers there may take the whole host"
        )
    # Imported here: resources imports this module. A value that loads but that
    # docker would refuse (cpus 0.001, memory 1Ki) raises ResourceError, a
    # ConfigError, so `cvs validate` exits 2 naming the key. Clamps are not
    # warned here: a per-host cap below the request is routine; `cvs up` says so.
    from orchestrator.resources import cluster_effective_resources

    cluster_effective_resources(cluster)
    if cluster.ssh.host_key_policy == "off":
        out.append("ssh.host_key_policy is off: host keys are not checked at all")
    return out


def normalized_cluster(cluster: ClusterConfig) -> dict[str, Any]:
    """A plain dict for `cvs validate`: hosts expanded, defaults filled in.

    Per-host address, port and user show the effective values (the host's
    override, else the ssh block's, else the name), so the output answers
    "what will be contacted" without reading the rules.
    """
    out = cluster.model_dump(mode="json", exclude={"source"})
    hosts = []
    for h in cluster.hosts:
        entry = h.model_dump(mode="json", exclude_none=True)
        entry["address"] = h.address or h.name
        entry["port"] = h.port or cluster.ssh.port
        user = h.user or cluster.ssh.user
        if user:
            entry["user"] = user
        hosts.append(entry)
    out["hosts"] = hosts
    out["head"] = cluster.head_host.name
    if cluster.container is not None:
        out["container"]["name"] = container_name(cluster)
    return out
