"""CVS cluster JSON (node_dict, username, priv_key_file, container.runtime) -> our document."""

from __future__ import annotations

import difflib
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
