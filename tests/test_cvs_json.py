"""CVS cluster files mean what they mean under CVS: files shaped like CVS's shipped samples."""

from __future__ import annotations

import getpass
import json
from pathlib import Path
from typing import Any

import pytest
from clitools import cvs_in_process

from orchestrator.config import ConfigError, cvs_import_notes, load_cluster

# Shaped like cvs/input/cluster_file/cluster.json (plain, baremetal).
PLAIN: dict[str, Any] = {
    "_user_comment": " user-id will be resolved to current username in runtime.",
    "username": "{user-id}",
    "priv_key_file": "/home/{user-id}/.ssh/id_rsa",
    "_port_comment": " SSH port for connecting to cluster nodes (default: 22).",
    "port": "22",
    "head_node_dict": {"mgmt_ip": "10.0.0.1"},
    "node_dict": {
        "10.0.0.1": {"bmc_ip": "NA", "vpc_ip": "10.0.0.1"},
        "10.0.0.2": {"bmc_ip": "NA", "vpc_ip": "10.0.0.2"},
    },
}

# Shaped like cluster_container.json: orchestrator container, enabled + launch,
# args giving only the scalars.
CONTAINER: dict[str, Any] = {
    "_orchestrator_comment": "Execution backend.",
    "orchestrator": "container",
    "username": "{user-id}",
    "priv_key_file": "/home/{user-id}/.ssh/id_rsa",
    "head_node_dict": {"mgmt_ip": "node-1"},
    "env_vars": {},
    "node_dict": {
        "node-1": {"bmc_ip": "NA", "vpc_ip": "node-1"},
        "node-2": {"bmc_ip": "NA", "vpc_ip": "node-2"},
    },
    "container": {
        "_enabled_comment": "Master switch.",
        "enabled": True,
        "launch": True,
        "image": "rocm/cvs:latest",
        "name": "cvs_container",
        "runtime": {
            "name": "docker",
            "args": {"network": "host", "ipc": "host", "privileged": True},
        },
    },
}

# Shaped like cluster_rack.json: rack_id per node and a racks block.
RACK: dict[str, Any] = {
    "_comment": "Rack-aware cluster.json",
    "username": "{user-id}",
    "priv_key_file": "/home/{user-id}/.ssh/id_rsa",
    "head_node_dict": {"mgmt_ip": "10.0.0.1"},
    "_env_vars_example": {"PATH": "/opt/rocm/bin:$PATH"},
    "env_vars": {},
    "node_dict": {
        "10.0.0.1": {"bmc_ip": "10.0.1.1", "vpc_ip": "10.0.0.1", "rack_id": "rack-01"},
        "10.0.0.2": {"bmc_ip": "10.0.1.2", "vpc_ip": "10.0.0.2", "rack_id": "rack-01"},
    },
    "racks": {
        "switch_ssh_user": "admin",
        "switch_ssh_password": "password",
        "rack-01": {"platform": "HeliosP", "switch_trays": ["10.0.2.1", "10.0.2.2"]},
    },
}


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data, indent=4))
    return path


def container_without_args() -> dict[str, Any]:
    data = json.loads(json.dumps(CONTAINER))
    data["container"]["runtime"] = {"name": "docker"}
    return data


def test_plain_sample_is_baremetal_with_its_port(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, PLAIN), check_files=False)
    assert [h.name for h in cluster.hosts] == ["10.0.0.1", "10.0.0.2"]
    assert cluster.ssh.port == 22
    assert cluster.ssh.user == getpass.getuser()
    assert cluster.container is None


def test_rack_sample_loads_ignoring_racks(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, RACK), check_files=False)
    assert [h.name for h in cluster.hosts] == ["10.0.0.1", "10.0.0.2"]
    assert all(h.vpc_address is None for h in cluster.hosts)
    assert cluster.container is None


def test_container_sample_gets_cvs_runtime_defaults(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, CONTAINER), check_files=False)
    c = cluster.container
    assert c is not None
    assert (c.image, c.name, c.lifetime) == ("rocm/cvs:latest", "cvs_container", "persistent")
    assert c.devices == ["/dev/kfd", "/dev/dri", "/dev/infiniband"]
    assert c.cap_add == ["SYS_PTRACE", "IPC_LOCK", "SYS_ADMIN"]
    assert c.security_opt == ["seccomp=unconfined", "apparmor=unconfined"]
    assert c.group_add == ["video"]
    assert c.ulimits == {"memlock": "-1"}
    assert (c.network, c.ipc, c.privileged) == ("host", "host", True)


def test_container_file_without_args_gets_the_same_defaults(tmp_path: Path) -> None:
    with_args = load_cluster(write(tmp_path, CONTAINER), check_files=False).container
    without = load_cluster(write(tmp_path, container_without_args()), check_files=False).container
    assert with_args == without


def test_list_args_append_and_scalars_override(tmp_path: Path) -> None:
    data = container_without_args()
    data["container"]["runtime"]["args"] = {
        "devices": ["/dev/dri", "/dev/fuse"],
        "cap_add": ["SYS_NICE"],
        "group_add": ["render"],
        "ulimit": ["nofile=65536", "memlock=1024"],
        "volumes": ["/data:/data:ro"],
        "network": "bridge",
        "privileged": False,
    }
    c = load_cluster(write(tmp_path, data), check_files=False).container
    assert c is not None
    assert c.devices == ["/dev/kfd", "/dev/dri", "/dev/infiniband", "/dev/fuse"]
    assert c.cap_add == ["SYS_PTRACE", "IPC_LOCK", "SYS_ADMIN", "SYS_NICE"]
    assert c.group_add == ["video", "render"]
    assert c.ulimits == {"memlock": "1024", "nofile": "65536"}
    assert c.volumes == ["/data:/data:ro"]
    assert (c.network, c.ipc, c.privileged) == ("bridge", "host", False)


def test_registry_arg_becomes_the_registry_login(tmp_path: Path) -> None:
    data = container_without_args()
    registry = {"username": "bot", "password_file": "/etc/cvs/pass", "server": "reg:5000"}
    data["container"]["runtime"]["args"] = {"registry": registry}
    c = load_cluster(write(tmp_path, data), check_files=False).container
    assert c is not None and c.registry is not None
    assert (c.registry.username, c.registry.password_file, c.registry.server) == (
        "bot",
        "/etc/cvs/pass",
        "reg:5000",
    )


def test_bad_ulimit_entry_is_named(tmp_path: Path) -> None:
    data = container_without_args()
    data["container"]["runtime"]["args"] = {"ulimit": ["memlock"]}
    with pytest.raises(ConfigError, match=r"runtime\.args\.ulimit: expected NAME=VALUE"):
        load_cluster(write(tmp_path, data), check_files=False)


@pytest.mark.parametrize(
    ("switches", "lifetime"),
    [({"enabled": True, "launch": True}, "persistent"), ({"enabled": True}, "no_launch")],
)
def test_launch_switch_maps_to_lifetime(
    tmp_path: Path, switches: dict[str, bool], lifetime: str
) -> None:
    data = container_without_args()
    del data["container"]["launch"]
    data["container"].update(switches)
    c = load_cluster(write(tmp_path, data), check_files=False).container
    assert c is not None and c.lifetime == lifetime


def test_disabled_or_baremetal_container_block_is_ignored_with_a_note(tmp_path: Path) -> None:
    disabled = container_without_args()
    disabled["container"]["enabled"] = False
    baremetal = container_without_args()
    del baremetal["orchestrator"]
    for data, said in ((disabled, "enabled is not true"), (baremetal, "baremetal")):
        cluster = load_cluster(write(tmp_path, data), check_files=False)
        assert cluster.container is None
        assert any(said in note for note in cvs_import_notes(cluster))


def test_validate_notes_cvs_defaults_and_the_tightening_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, CONTAINER)
    proc = cvs_in_process("validate", "-c", str(path), "--no-check-files", ci=False)
    assert proc.returncode == 0, proc.stderr
    assert "note: CVS runtime defaults in effect" in proc.stderr
    assert "SYS_ADMIN" in proc.stderr and "privileged" in proc.stderr
    assert "privileged: false" in proc.stderr
    # The tightened block is valid native YAML for the same cluster.
    after = proc.stderr.split("drops them", 1)[1].split(":\n", 1)[1].splitlines()
    block = []
    for line in after:
        if not (line.startswith("container:") or line.startswith(" ")):
            break
        block.append(line)
    native = tmp_path / "native.yaml"
    native.write_text("hosts: [node-1, node-2]\n" + "\n".join(block) + "\n")
    c = load_cluster(native, check_files=False).container
    assert c is not None and not c.privileged and "SYS_ADMIN" not in c.cap_add


def test_gpu_subset_in_a_cvs_file_points_to_the_native_format(tmp_path: Path) -> None:
    data = container_without_args()
    data["container"]["gpus"] = {"count": 2}
    with pytest.raises(ConfigError, match="use the native format"):
        load_cluster(write(tmp_path, data), check_files=False)


def test_cvs_runtime_name_podman_is_our_podman_runtime_with_the_same_args(tmp_path: Path) -> None:
    data = json.loads(json.dumps(CONTAINER))
    data["container"]["runtime"]["name"] = "podman"
    data["container"]["rootless"] = True  # ours, next to CVS's block

    c = load_cluster(write(tmp_path, data), check_files=False).container

    assert c is not None and (c.runtime, c.rootless) == ("podman", True)
    assert c.privileged is True and c.devices == ["/dev/kfd", "/dev/dri", "/dev/infiniband"]


@pytest.mark.parametrize("name", ["enroot", "Docker", ""])
def test_a_cvs_runtime_name_we_do_not_run_is_refused_naming_both_we_do(
    tmp_path: Path, name: str
) -> None:
    data = json.loads(json.dumps(CONTAINER))
    data["container"]["runtime"]["name"] = name

    with pytest.raises(ConfigError, match="only 'docker' and 'podman' are supported"):
        load_cluster(write(tmp_path, data), check_files=False)
