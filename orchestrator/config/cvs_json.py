"""CVS cluster JSON (node_dict, username, priv_key_file, container.runtime) -> our document.

A CVS file means here what it means under CVS (its cluster-file reference,
"Docker runtime.args reference"):

- `orchestrator` defaults to `baremetal`: the `container` block is used only
  with `orchestrator: container`. `container.lifetime` (no_launch, per_run,
  persistent) means what it means under CVS main, and defaults to per_run
  as there. Older CVS releases' switches are still read: `enabled` not true
  ignores the block; `launch` true is `persistent` (started if absent, kept),
  false `no_launch` (only verified).
- `runtime.args.registry.server` empty is Docker Hub, as in CVS's runtime.
- `runtime.name` is `docker` (CVS's) or `podman` (ours: CVS ships docker
  only): it becomes `container.runtime`, and the same `args` apply (podman
  takes docker's run flags). Rootless podman is our own `container.rootless`
  next to it, which CVS ignores.
- `runtime.args` is merged with CVS's built-in defaults (an empty `args`
  gives an RDMA-ready, privileged container): list arguments are appended to
  the defaults, scalars override them.

What came from CVS's defaults is recorded in `ClusterConfig.cvs_notes` so
`cvs validate` can say so and show the native YAML that tightens it.
"""

from __future__ import annotations

import getpass
from typing import Any

from orchestrator.config.documents import ConfigError, Located, describe_value

# ---- CVS cluster JSON -------------------------------------------------------

_CVS_TOP_KEYS = {
    "node_dict",
    "username",
    "priv_key_file",
    "head_node_dict",
    "env_vars",
    "container",
    "orchestrator",
    "port",
}
# CVS keys that mean nothing to this orchestrator (BMC access, rack/switch
# maps, home mount name for CVS's own scripts): accepted and ignored.
_CVS_IGNORED_KEYS = {"home_mount_dir_name", "racks"}
# Our own sections, allowed in a CVS cluster JSON next to CVS's keys: CVS's
# OrchestratorConfig reads only its own keys, so one file serves both engines
# (known_hosts, host-key policy, timeouts, caps, the state directory).
# `hosts_from: slurm`: node_dict names nodes of the running Slurm job (their
# addresses, GPUs and the job ID come from Slurm; config/loader.py).
CVS_NATIVE_KEYS = frozenset({"name", "ssh", "concurrency", "limits", "state_dir", "hosts_from"})
_CVS_NODE_KEYS = {"bmc_ip", "vpc_ip", "rack_id"}
_CVS_ORCHESTRATORS = ("baremetal", "container")

# CVS's DEFAULT_CONTAINER_ARGS, as its documentation states them. Keys are
# ours (the model's); the list ones are appended to, the scalars overridden.
CVS_DEFAULT_LISTS: dict[str, list[str]] = {
    "devices": ["/dev/kfd", "/dev/dri", "/dev/infiniband"],
    "cap_add": ["SYS_PTRACE", "IPC_LOCK", "SYS_ADMIN"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "group_add": ["video"],
}
CVS_DEFAULT_ULIMITS: dict[str, str] = {"memlock": "-1"}
CVS_DEFAULT_SCALARS: dict[str, Any] = {"network": "host", "ipc": "host", "privileged": True}

# CVS's container.runtime.args names -> ours. The documented names come
# first; the others are the spellings of CVS's DEFAULT_CONTAINER_ARGS and
# older CVS files, accepted as aliases.
_CVS_RUNTIME_ARGS = {
    "volumes": "volumes",
    "devices": "devices",
    "cap_add": "cap_add",
    "security_opt": "security_opt",
    "group_add": "group_add",
    "ulimit": "ulimits",
    "network": "network",
    "ipc": "ipc",
    "privileged": "privileged",
    "env": "env",
    "registry": "registry",
    "capabilities": "cap_add",
    "security_opts": "security_opt",
    "groups": "group_add",
    "ulimits": "ulimits",
    "environment": "env",
    "network_mode": "network",
    "ipc_mode": "ipc",
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
    import difflib  # only for a bad key: not on every load (tests/test_startup.py)

    close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(located.error([*path, key], f"unknown key in a CVS cluster file{hint}"))


def _ulimits(value: Any, located: Located, key: str) -> Any:
    """CVS writes ulimits as ["memlock=-1", ...]; ours is a mapping."""
    if not isinstance(value, list):
        return value  # a mapping (ours) passes; the model reports anything else
    limits: dict[str, Any] = {}
    for item in value:
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(
                located.error(
                    ["container", "runtime", "args", key],
                    f"expected NAME=VALUE entries, got {describe_value(item)}",
                )
            )
        limit, _, amount = item.partition("=")
        limits[limit] = amount
    return limits


def _append(defaults: list[str], extra: Any) -> Any:
    if not isinstance(extra, list):
        return extra  # the model reports the type
    out = list(defaults)
    out += [v for v in extra if v not in out]
    return out


def _lifetime(block: dict[str, Any], located: Located, notes: list[str]) -> str | None:
    """CVS's enabled/launch switches -> our lifetime; None when the block is off."""
    enabled = block.get("enabled")
    launch = block.get("launch")
    if "lifetime" in block:
        for key in ("enabled", "launch"):
            if key in block:
                raise ConfigError(
                    located.error(
                        ["container", key],
                        "conflicts with container.lifetime: keep one (lifetime is "
                        "no_launch, per_run or persistent)",
                    )
                )
        lifetime: str | None = block["lifetime"]
        return lifetime
    if "enabled" not in block and "launch" not in block:
        # CVS main: `lifetime` absent means per_run (its factory's default).
        notes.append("container.lifetime not set: per_run, CVS's default")
        return "per_run"
    notes.append(
        "container.enabled / container.launch are the switches of older CVS releases "
        "(CVS main refuses them): set container.lifetime instead"
    )
    for key, value in (("enabled", enabled), ("launch", launch)):
        if value is not None and not isinstance(value, bool):
            raise ConfigError(
                located.error(["container", key], f"expected true or false, got {value!r}")
            )
    if not enabled:
        notes.append(
            "container.enabled is not true: the container block is ignored, as under CVS "
            '(set "enabled": true to use it)'
        )
        return None
    if launch:
        notes.append(
            "container.launch true: containers are started if absent and kept between runs "
            "(lifetime: persistent)"
        )
        return "persistent"
    notes.append(
        "container.launch is not true: the containers must already run; nothing is started "
        "(lifetime: no_launch)"
    )
    return "no_launch"


def _runtime_args(block: dict[str, Any], located: Located) -> dict[str, Any]:
    runtime = block.get("runtime")
    if runtime is None:
        return {}
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
    if name not in ("docker", "podman"):
        raise ConfigError(
            located.error(
                ["container", "runtime", "name"],
                f"only 'docker' and 'podman' are supported, got {name!r}",
            )
        )
    args = runtime.get("args") or {}
    if not isinstance(args, dict):
        raise ConfigError(
            located.error(
                ["container", "runtime", "args"], f"expected a mapping, got {describe_value(args)}"
            )
        )
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in args.items():
        if _cvs_comment(key):
            continue
        if key not in _CVS_RUNTIME_ARGS:
            raise _unknown(located, ["container", "runtime", "args"], key, set(_CVS_RUNTIME_ARGS))
        ours = _CVS_RUNTIME_ARGS[key]
        if ours in spelled:
            raise ConfigError(
                located.error(
                    ["container", "runtime", "args", key],
                    f"same setting as runtime.args.{spelled[ours]} (set it once)",
                )
            )
        spelled[ours] = key
        if ours == "registry" and isinstance(value, dict) and value.get("server") == "":
            # CVS's docker runtime: `server` empty or absent is Docker Hub.
            value = {k: v for k, v in value.items() if k != "server"}
        out[ours] = _ulimits(value, located, key) if ours == "ulimits" else value
    return out


def _cvs_container(block: Any, located: Located, notes: list[str]) -> Any:
    if not isinstance(block, dict):
        return block  # the model reports the type
    lifetime = _lifetime(block, located, notes)
    if lifetime is None:
        return None
    out = {
        k: v
        for k, v in block.items()
        if not _cvs_comment(k) and k not in ("runtime", "enabled", "launch")
    }
    out["lifetime"] = lifetime
    args = _runtime_args(block, located)  # validates runtime.name too
    runtime = block.get("runtime")
    if isinstance(runtime, dict) and runtime.get("name") == "podman":
        out["runtime"] = "podman"
    for ours, value in args.items():
        if ours in out:
            if ours == "env" and isinstance(value, dict) and isinstance(out["env"], dict):
                out["env"] = {**value, **out["env"]}
                continue
            raise ConfigError(
                located.error(
                    ["container", "runtime", "args", ours],
                    f"conflicts with container.{ours} (set it in one place)",
                )
            )
        out[ours] = value
    # CVS's defaults, under what the file says: lists appended, scalars kept.
    in_effect: list[str] = []
    for key, defaults in CVS_DEFAULT_LISTS.items():
        out[key] = _append(defaults, out.get(key, []))
        in_effect.append(f"{key} {', '.join(defaults)}")
    ulimits = out.get("ulimits", {})
    if isinstance(ulimits, dict):
        out["ulimits"] = {**CVS_DEFAULT_ULIMITS, **ulimits}
        in_effect.append("ulimit memlock=-1")
    for key, default in CVS_DEFAULT_SCALARS.items():
        if key not in out:
            out[key] = default
            in_effect.append(f"{key} {str(default).lower()}")
    notes.append(
        "CVS runtime defaults in effect (lists appended to, scalars unless the file sets "
        f"them): {'; '.join(in_effect)}"
    )
    return out


def _from_cvs(data: dict[str, Any], located: Located) -> dict[str, Any]:
    data = _replace_user(data, getpass.getuser())
    located = Located(located.source, None)  # positions don't survive the rewrite
    if data.get("password") is not None:
        raise ConfigError(
            located.error(
                ["password"],
                "password logins are not supported (a password would sit in the file); "
                "use priv_key_file with a key the hosts accept",
            )
        )
    data = {k: v for k, v in data.items() if k != "password"}  # CVS's `null` default
    for key in data:
        if _cvs_comment(key) or key in _CVS_TOP_KEYS | _CVS_IGNORED_KEYS | CVS_NATIVE_KEYS:
            continue
        raise _unknown(located, [], key, _CVS_TOP_KEYS | _CVS_IGNORED_KEYS | CVS_NATIVE_KEYS)
    out: dict[str, Any] = {"hosts": _cvs_hosts(data["node_dict"], located)}
    out.update({k: v for k, v in data.items() if k in CVS_NATIVE_KEYS and k != "ssh"})
    ssh = _cvs_ssh(data, located)
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
    notes: list[str] = []
    converted = _cvs_orchestrated(data, located, notes)
    if converted is not None:
        out["container"] = converted
    out["cvs_notes"] = notes
    return out


def _cvs_hosts(nodes: Any, located: Located) -> list[dict[str, Any]]:
    """CVS's `node_dict`: our host entries."""
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
    return hosts


def _cvs_ssh(data: dict[str, Any], located: Located) -> dict[str, Any]:
    """Our `ssh` block: its own keys, and CVS's username, priv_key_file, port."""
    ssh = data.get("ssh") or {}
    if not isinstance(ssh, dict):
        raise ConfigError(located.error(["ssh"], f"expected a mapping, got {describe_value(ssh)}"))
    ssh = dict(ssh)
    port = data.get("port")
    if port is not None:
        # CVS's sample writes the port as a string ("22").
        port = int(port) if isinstance(port, str) and port.isdigit() else port
    for cvs_key, ours, value in (
        ("username", "user", data.get("username")),
        ("priv_key_file", "identity_files", [data.get("priv_key_file")]),
        ("port", "port", port),
    ):
        if data.get(cvs_key) is None:
            continue
        if ours in ssh:
            raise ConfigError(
                located.error(["ssh", ours], f"conflicts with {cvs_key} (set it in one place)")
            )
        ssh[ours] = value
    return ssh


def _cvs_orchestrated(data: dict[str, Any], located: Located, notes: list[str]) -> Any:
    """Our `container` block from CVS's `orchestrator` and `container`, or None
    (what is not a mapping as it is: the model reports its type)."""
    container = data.get("container")
    orchestrator = data.get("orchestrator", "baremetal")
    if orchestrator not in _CVS_ORCHESTRATORS:
        raise ConfigError(
            located.error(
                ["orchestrator"],
                f"expected one of {', '.join(_CVS_ORCHESTRATORS)}, got {orchestrator!r}",
            )
        )
    if container is not None and orchestrator == "baremetal":
        if container:
            notes.append(
                "orchestrator is baremetal (CVS's default): the container block is ignored; "
                'set "orchestrator": "container" to use it'
            )
        return None
    if container is None:
        return None
    return _cvs_container(container, located, notes)
