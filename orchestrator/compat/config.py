"""CVS's configuration -> our ClusterConfig, the way CVS builds its own.

CVS merges the cluster JSON and the test config JSON (the test config wins
per top-level key) and hands its orchestrator only `orchestrator`,
`node_dict`, `username`, `priv_key_file`, `password`, `head_node_dict` and
`container` (`OrchestratorConfig.from_configs`). We take the same keys, plus
our own sections (`ssh`, `concurrency`, `limits`, `state_dir`, `name`) from
the cluster file, and load them through the CVS-JSON import.
"""

from __future__ import annotations

import getpass
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.config import ClusterConfig, ConfigError, cluster_from_data
from orchestrator.config.cvs_json import CVS_NATIVE_KEYS

# What CVS's OrchestratorConfig carries.
CVS_CONFIG_KEYS = (
    "orchestrator",
    "node_dict",
    "username",
    "priv_key_file",
    "password",
    "head_node_dict",
    "container",
)
BACKENDS = ("baremetal", "container")
# The default limit for the commands our own lifecycle runs under a CVS cluster
# file (CVS never bounds those). The suite's own calls with timeout=None run with
# no limit at all (compat/cvs.py), unless the file's `ssh.command_timeout` is set.
UNBOUNDED_COMMAND_TIMEOUT = 86400.0


def sanitize_image(image: str) -> str:
    """CVS's: every character but letters, digits and `_` becomes `_`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", image)


def cvs_container_name(container_config: Mapping[str, Any], image: str) -> str:
    """CVS's rule: `container.name`, else `<local user>_<sanitized image>`."""
    name = container_config.get("name")
    if name:
        return str(name)
    return f"{getpass.getuser()}_{sanitize_image(image)}"


def read_json(path: str, label: str) -> dict[str, Any]:
    """A JSON object from `path`; ConfigError naming the option on any problem."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{label} {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{label} {path}: cannot read it: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{label} {path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{label} {path}: expected a JSON object at the top level")
    return data


def keys_from_files(cluster_file: str, config_file: str | None) -> dict[str, Any]:
    """CVS's merge: cluster JSON updated by the test config JSON, CVS's keys only."""
    merged = read_json(cluster_file, "--cluster_file")
    if config_file:
        merged.update(read_json(config_file, "--config_file"))
    keys = {k: merged.get(k) for k in CVS_CONFIG_KEYS}
    keys["orchestrator"] = keys["orchestrator"] or "baremetal"
    return keys


def keys_from_config(config: Any) -> dict[str, Any]:
    """CVS's keys from an OrchestratorConfig (or any object with those attributes)."""
    keys = {k: getattr(config, k, None) for k in CVS_CONFIG_KEYS}
    keys["orchestrator"] = keys["orchestrator"] or "baremetal"
    return keys


def native_sections(cluster_file: str | None) -> dict[str, Any]:
    """Our own sections of a cluster JSON (empty without a file)."""
    if not cluster_file:
        return {}
    data = read_json(cluster_file, "--cluster_file")
    return {k: v for k, v in data.items() if k in CVS_NATIVE_KEYS}


def _node_dict(nodes: Any) -> Any:
    # CVS also accepts a list of {"mgmt_ip": ...} entries.
    if isinstance(nodes, list):
        out: dict[str, Any] = {}
        for node in nodes:
            if not isinstance(node, dict) or not isinstance(node.get("mgmt_ip"), str):
                raise ConfigError("node_dict: a list entry needs a 'mgmt_ip' string")
            out[node["mgmt_ip"]] = {k: v for k, v in node.items() if k != "mgmt_ip"}
        return out
    return nodes


def backend(keys: Mapping[str, Any]) -> str:
    kind = str(keys.get("orchestrator") or "baremetal").lower()
    if kind not in BACKENDS:
        raise ConfigError(
            f"orchestrator: {kind!r} is not a backend cvs-orchestrator runs "
            f"(use {' or '.join(repr(b) for b in BACKENDS)})"
        )
    return kind


def cluster_from_cvs(
    keys: Mapping[str, Any],
    native: Mapping[str, Any] | None = None,
    *,
    source: str = "CVS OrchestratorConfig",
    base_dir: Path | None = None,
    check_files: bool = True,
) -> ClusterConfig:
    """Our ClusterConfig for CVS's keys (and our own sections). Raises ConfigError."""
    for required in ("node_dict", "username", "priv_key_file"):
        if keys.get(required) is None:
            raise ConfigError(f"{source}: {required}: required by CVS, missing")
    if keys.get("password") is not None:
        raise ConfigError(
            f"{source}: password: password logins are not supported (a password would "
            "travel in the config); use priv_key_file with a key the hosts accept"
        )
    kind = backend(keys)
    doc: dict[str, Any] = {k: v for k, v in (native or {}).items() if k in CVS_NATIVE_KEYS}
    ssh = dict(doc.get("ssh") or {})
    ssh.setdefault("command_timeout", UNBOUNDED_COMMAND_TIMEOUT)
    doc["ssh"] = ssh
    doc["orchestrator"] = kind
    doc["node_dict"] = _node_dict(keys["node_dict"])
    doc["username"] = keys["username"]
    doc["priv_key_file"] = keys["priv_key_file"]
    # CVS's head is the first node_dict key (head_node_dict is for CVS's own
    # libraries), so `head` is left to default to the first host here too.
    container = keys.get("container")
    if kind == "container":
        if not isinstance(container, dict) or not container.get("image"):
            raise ConfigError(
                f"{source}: container.image: the container backend needs a container block "
                "with an image"
            )
        container = dict(container)
        # Our container name is the one CVS's get_container_name() returns, so
        # suites that name the container themselves find it.
        container["name"] = cvs_container_name(container, str(container["image"]))
        doc["container"] = container
    base = base_dir if base_dir is not None else Path(os.getcwd())
    return cluster_from_data(doc, source, base, check_files=check_files)


def cluster_from_files(
    cluster_file: str, config_file: str | None, *, check_files: bool = True
) -> ClusterConfig:
    """What our engine will run, from the two files `cvs run` is given."""
    return cluster_from_cvs(
        keys_from_files(cluster_file, config_file),
        native_sections(cluster_file),
        source=cluster_file,
        base_dir=Path(os.path.abspath(cluster_file)).parent,
        check_files=check_files,
    )
