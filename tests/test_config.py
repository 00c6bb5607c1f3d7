"""Cluster-file loading: good files, malformed files, CVS JSON, derived views."""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from properties import examples

from orchestrator.config import (
    ClusterConfig,
    ConfigError,
    JumpHop,
    cluster_from_data,
    cluster_warnings,
    container_name,
    jump_hops,
    load_cluster,
    normalized_cluster,
    parse_cluster,
)

SAMPLES = Path(__file__).resolve().parent.parent / "cluster_samples"


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


# ---- malformed files: one line naming the file and the key or line ---------

MALFORMED = [
    # (id, file text, fragments that must all appear in the message)
    # Where the structure broke, in words, with the line (issue 25; PyYAML said
    # ":2:4: expected ',' or ']', but got ':'").
    (
        "yaml_syntax",
        "hosts: [a\nssh: {\n",
        [
            ":1:8:",
            "'[' opened on this line is never closed: end it with ']'",
            'line 1: "hosts: [a"',
        ],
    ),
    ("unknown_top_key", "hosts: [a]\nshh: {}\n", [":2:", "shh", "did you mean 'ssh'?"]),
    (
        "unknown_nested_key",
        "hosts: [a]\ncontainer:\n  image: x\n  lifetme: persistent\n",
        [":4:", "container.lifetme", "did you mean 'lifetime'?"],
    ),
    (
        "unknown_host_override",
        "hosts:\n  - name: gpu[1-4]\n    prot: 2222\n",
        [":3:", "hosts[0].prot", "did you mean 'port'?"],
    ),
    ("port_not_a_number", "hosts: [a]\nssh:\n  port: abc\n", ["ssh.port", "expected an integer"]),
    (
        "port_out_of_range",
        "hosts:\n  - a\n  - name: b\n    port: 70000\n",
        [":4:", "hosts[1].port", "at most 65535"],
    ),
    ("empty_hosts", "hosts: []\n", ["hosts", "empty"]),
    ("missing_hosts", "ssh: {}\n", ["hosts", "missing"]),
    (
        "duplicate_after_expansion",
        "hosts:\n  - gpu[01-03]\n  - gpu02\n",
        ["hosts[1]", "duplicate host 'gpu02'", "hosts[0]"],
    ),
    ("bad_hostlist", "hosts: ['gpu[3-1]']\n", ["hosts[0]", "reversed range"]),
    ("unclosed_hostlist", "hosts:\n  - name: 'gpu[1-3'\n", ["hosts[0].name", "unclosed"]),
    (
        "invalid_lifetime",
        "hosts: [a]\ncontainer: {image: x, lifetime: forever}\n",
        ["container.lifetime", "'persistent'", "forever"],
    ),
    (
        "legacy_enabled",
        "hosts: [a]\ncontainer: {image: x, enabled: true}\n",
        ["container", "container.enabled", "lifetime"],
    ),
    (
        "legacy_launch",
        "hosts: [a]\ncontainer:\n  image: x\n  launch: true\n",
        ["container", "container.launch", "persistent"],
    ),
    (
        "bad_memory_unit",
        "hosts: [a]\ncontainer:\n  image: x\n  resources: {memory: 16Q}\n",
        ["container.resources.memory", "16Q"],
    ),
    ("bad_limit_memory", "hosts: [a]\nlimits: {max_memory: lots}\n", ["limits.max_memory"]),
    (
        "bad_gpu_min_memory",
        "hosts: [a]\ncontainer: {image: x, gpus: {min_memory: 80X}}\n",
        ["container.gpus.min_memory"],
    ),
    (
        "bad_shm_size",
        "hosts: [a]\ncontainer: {image: x, shm_size: -1g}\n",
        ["container.shm_size"],
    ),
    (
        "cpus_zero",
        "hosts: [a]\ncontainer:\n  image: x\n  resources: {cpus: 0}\n",
        ["container.resources.cpus", "greater than 0"],
    ),
    ("max_cpus_negative", "hosts: [a]\nlimits: {max_cpus: -2}\n", ["limits.max_cpus"]),
    ("pids_zero", "hosts: [a]\nlimits: {max_pids: 0}\n", ["limits.max_pids", "at least 1"]),
    ("top_level_list", "- a\n- b\n", ["top level must be a mapping", "a list"]),
    ("top_level_scalar", "just text\n", ["top level must be a mapping"]),
    ("empty_file", "", ["empty"]),
    (
        "container_name_injection",
        "hosts: [a]\ncontainer: {image: x, name: 'x; rm -rf /'}\n",
        ["container.name", "invalid container name"],
    ),
    (
        "image_ref_injection",
        "hosts: [a]\ncontainer: {image: 'ubuntu $(reboot)'}\n",
        ["container.image", "invalid image reference"],
    ),
    ("head_not_a_host", "hosts: [a, b]\nhead: c\n", ["head", "'c' is not one of the hosts"]),
    (
        "gpus_wrong_type",
        "hosts: [a]\ncontainer: {image: x, gpus: 3}\n",
        ["container.gpus", "expected 'all' or a mapping"],
    ),
    (
        "gpus_unknown_key",
        "hosts: [a]\ncontainer: {image: x, gpus: {cnt: 3}}\n",
        ["container.gpus.cnt", "did you mean 'count'?"],
    ),
    ("duplicate_yaml_key", "hosts: [a]\nssh: {}\nssh: {}\n", [":3:1:", "duplicate key 'ssh'"]),
    ("host_entry_wrong_type", "hosts:\n  - 5\n", ["hosts[0]", "an integer"]),
    ("host_mapping_without_name", "hosts:\n  - port: 22\n", ["hosts[0]", "'name'"]),
    ("invalid_host_name", "hosts: ['-gpu']\n", ["hosts[0]", "invalid host name"]),
    ("env_value_not_string", "hosts: [a]\nenv: {A: 1}\n", ["env.A", "quote it"]),
    ("bad_env_name", "hosts: [a]\nenv: {'A-B': x}\n", ["env", "'A-B'"]),
    ("missing_image", "hosts: [a]\ncontainer: {name: c}\n", ["container.image", "missing"]),
    ("container_not_mapping", "hosts: [a]\ncontainer: 5\n", ["container", "a mapping"]),
    ("source_is_reserved", "hosts: [a]\nsource: /x\n", ["source", "loader"]),
    ("python_tag_refused", "hosts: !!python/object:os.system [a]\n", [":1:8:", "constructor"]),
    ("host_key_policy", "hosts: [a]\nssh: {host_key_policy: yolo}\n", ["ssh.host_key_policy"]),
    # Issue 14.4: nothing reaches a shell, an ssh config or a docker argv unvalidated.
    (
        "newline_in_vpc_address",
        'hosts:\n  - {name: a, vpc_address: "10.0.0.2\\nProxyCommand touch /tmp/x"}\n',
        ["hosts[0].vpc_address", "invalid vpc_address"],
    ),
    (
        "trailing_newline_in_address",
        'hosts:\n  - {name: a, address: "10.0.0.2\\n"}\n',
        ["hosts[0].address", "invalid address"],
    ),
    (
        "trailing_newline_in_name",
        'hosts:\n  - {name: "gpu1\\n"}\n',
        ["hosts[0]", "bad character"],
    ),
    (
        "space_in_address",
        "hosts:\n  - {name: a, address: '10.0.0.2 -oProxyCommand=x'}\n",
        ["hosts[0].address", "invalid address"],
    ),
    (
        "host_port_as_name",
        "hosts: ['127.0.0.1:2222']\n",
        ["hosts[0]", "carries a port", "address: 127.0.0.1, port: 2222"],
    ),
    (
        "vpc_address_with_port",
        "hosts:\n  - {name: a, vpc_address: '10.0.0.2:22'}\n",
        ["hosts[0].vpc_address", "carries a port"],
    ),
    (
        "address_port_disagrees",
        "hosts:\n  - {name: a, address: '10.0.0.2:2222', port: 22}\n",
        ["hosts[0]", "port 2222", "give the port once"],
    ),
    ("bad_ssh_user", "hosts: [a]\nssh: {user: 'root\\nHost *'}\n", ["ssh.user", "invalid user"]),
    (
        "bad_proxy_jump",
        "hosts: [a]\nssh: {proxy_jump: 'bastion -oProxyCommand=x'}\n",
        ["ssh.proxy_jump", "invalid proxy_jump"],
    ),
    (
        "proxy_jump_port_out_of_range",
        "hosts: [a]\nssh: {proxy_jump: 'bastion:70000'}\n",
        ["ssh.proxy_jump", "invalid proxy_jump hop 'bastion:70000'"],
    ),
    (
        "network_option_injection",
        "hosts: [a]\ncontainer: {image: x, network: '--privileged'}\n",
        ["container.network", "leading '-'"],
    ),
    (
        "volume_with_newline",
        'hosts: [a]\ncontainer: {image: x, volumes: ["/a:/b\\n"]}\n',
        ["container.volumes", "control characters"],
    ),
    (
        "container_name_trailing_newline",
        'hosts: [a]\ncontainer: {image: x, name: "c\\n"}\n',
        ["container.name", "invalid container name"],
    ),
    (
        "image_trailing_newline",
        'hosts: [a]\ncontainer: {image: "x\\n"}\n',
        ["container.image", "invalid image reference"],
    ),
    (
        "cluster_name_escapes_state_dir",
        "name: '../../etc'\nhosts: [a]\n",
        ["name", "invalid cluster name"],
    ),
    (
        "registry_server_option",
        "hosts: [a]\ncontainer:\n  image: x\n"
        "  registry: {username: u, password_file: /p, server: '--help'}\n",
        ["container.registry.server", "invalid registry server"],
    ),
    (
        "registry_user_newline",
        "hosts: [a]\ncontainer:\n  image: x\n"
        '  registry: {username: "u\\nx", password_file: /p}\n',
        ["container.registry.username", "control characters"],
    ),
    # Issue 14.8: NaN, infinite and negative numbers name the key.
    ("start_timeout_inf", "hosts: [a]\ncontainer: {image: x, start_timeout: .inf}\n",
     ["container.start_timeout", "finite"]),
    ("start_timeout_nan", "hosts: [a]\ncontainer: {image: x, start_timeout: .nan}\n",
     ["container.start_timeout", "finite"]),
    ("max_cpus_inf", "hosts: [a]\nlimits: {max_cpus: .inf}\n", ["limits.max_cpus", "finite"]),
    ("cpus_inf", "hosts: [a]\ncontainer: {image: x, resources: {cpus: .inf}}\n",
     ["container.resources.cpus", "finite"]),
    ("command_timeout_negative", "hosts: [a]\nssh: {command_timeout: -1}\n",
     ["ssh.command_timeout", "greater than 0"]),
    ("connect_timeout_inf", "hosts: [a]\nssh: {connect_timeout: .inf}\n",
     ["ssh.connect_timeout", "finite"]),
    (
        "host_key_policy_off_unquoted",
        "hosts: [a]\nssh: {host_key_policy: off}\n",
        ["ssh.host_key_policy", "got a boolean (false)", 'quote the word, e.g. "off"'],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fragments"), [(t, f) for _, t, f in MALFORMED], ids=[i for i, _, _ in MALFORMED]
)
def test_malformed_file_gives_one_line_naming_file_and_key(
    tmp_path: Path, text: str, fragments: list[str]
) -> None:
    message = load_error(write(tmp_path, text))
    for fragment in fragments:
        assert fragment in message


def test_missing_identity_file_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts: [a]\nssh:\n  identity_files: [keys/id_missing]\n")
    message = load_error(path)
    assert "ssh.identity_files[0]" in message
    assert str(tmp_path / "keys" / "id_missing") in message


def test_missing_setup_script_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts: [a]\ncontainer: {image: x, setup_script: setup/nope.sh}\n")
    message = load_error(path)
    assert "container.setup_script" in message
    assert str(tmp_path / "setup" / "nope.sh") in message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    load_error(tmp_path / "absent.yaml")


def test_directory_is_a_config_error(tmp_path: Path) -> None:
    assert "directory" in load_error(tmp_path)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_bytes(b"hosts: [a]\nname: caf\xe9\n")
    message = load_error(path)
    assert ":2:" in message
    assert "UTF-8" in message


def test_json_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "hosts": ["a"],\n  "ssh": }\n', "cluster.json")
    assert ":3:10:" in load_error(path)


def test_several_problems_report_the_first_and_a_count(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "hosts: [a]\nssh: {port: 0}\nlimits: {max_pids: 0}\n"))
    assert "ssh.port" in message
    assert "and 1 more problem" in message


def test_hostlist_override_errors_are_reported_once(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "hosts:\n  - name: gpu[1-8]\n    port: 0\n"))
    assert "hosts[0].port" in message
    assert "more problem" not in message


# ---- good files ----------------------------------------------------------------


def test_hosts_expand_and_overrides_apply_to_every_expanded_host(tmp_path: Path) -> None:
    cluster = load_cluster(
        write(
            tmp_path,
            "hosts:\n"
            "  - gpu[001-002]\n"
            "  - name: big[1-2]\n"
            "    port: 2222\n"
            "    limits: {max_cpus: 4}\n"
            "  - 10.1.0.[1-2]\n",
        )
    )
    assert [h.name for h in cluster.hosts] == [
        "gpu001",
        "gpu002",
        "big1",
        "big2",
        "10.1.0.1",
        "10.1.0.2",
    ]
    assert [h.port for h in cluster.hosts] == [None, None, 2222, 2222, None, None]
    assert cluster.host("big2").limits is not None
    assert cluster.host("big2").limits.max_cpus == 4


def test_single_string_hosts_is_accepted(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts: node[1-3]\n"))
    assert [h.name for h in cluster.hosts] == ["node1", "node2", "node3"]


def test_head_defaults_to_first_host(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts: [b, a]\n"))
    assert cluster.head == "b"
    assert cluster.head_host.name == "b"


def test_paths_resolve_relative_to_the_cluster_file(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_text("key")
    (tmp_path / "setup.sh").write_text("#!/bin/sh\n")
    cluster = load_cluster(
        write(
            tmp_path,
            "hosts: [a]\n"
            "ssh: {identity_files: keys/id_ed25519, known_hosts: kh}\n"
            "state_dir: state\n"
            "container: {image: x, setup_script: setup.sh}\n",
        )
    )
    assert cluster.ssh.identity_files == [str(tmp_path / "keys" / "id_ed25519")]
    assert cluster.ssh.known_hosts == str(tmp_path / "kh")
    assert cluster.state_dir == str(tmp_path / "state")
    assert cluster.container is not None
    assert cluster.container.setup_script == str(tmp_path / "setup.sh")
    assert cluster.source == str(tmp_path)


def test_tilde_is_expanded_in_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "id_test").write_text("key")
    cluster = load_cluster(write(tmp_path, "hosts: [a]\nssh: {identity_files: [~/id_test]}\n"))
    assert cluster.ssh.identity_files == [str(tmp_path / "id_test")]


def test_empty_setup_script_means_default(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts: [a]\ncontainer: {image: x, setup_script: ''}\n"))
    assert cluster.container is not None
    assert cluster.container.setup_script is None


def test_empty_identity_files_stay_empty(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, "hosts: [a]\n"))
    assert cluster.ssh.identity_files == []


def test_check_files_false_skips_existence_checks(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "hosts: [a]\nssh: {identity_files: [nope]}\ncontainer: {image: x, setup_script: no.sh}\n",
    )
    cluster = load_cluster(path, check_files=False)
    assert cluster.ssh.identity_files == [str(tmp_path / "nope")]


@pytest.mark.parametrize("size", ["512Mi", "16G", "1.5g", "1073741824", 1073741824, "2GiB"])
def test_memory_sizes_with_units_are_accepted(tmp_path: Path, size: object) -> None:
    text = yaml.safe_dump(
        {"hosts": ["a"], "container": {"image": "x", "resources": {"memory": size}}}
    )
    cluster = load_cluster(write(tmp_path, text))
    assert cluster.container is not None
    assert cluster.container.resources.memory == str(size)


def test_x_keys_hold_anchors_and_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    cluster = load_cluster(
        write(
            tmp_path,
            "x-caps: &caps {max_cpus: 8, max_pids: 100}\n"
            "hosts: [a]\n"
            "limits:\n  <<: *caps\n  max_cpus: 4\n",
        )
    )
    assert cluster.limits is not None
    assert (cluster.limits.max_cpus, cluster.limits.max_pids) == (4, 100)


def test_json_with_tabs_loads(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, '{\t"hosts":\t["a"]}', "cluster.json"))
    assert [h.name for h in cluster.hosts] == ["a"]


def test_duplicate_json_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '{"hosts": ["a"], "hosts": ["b"]}', "cluster.json")
    assert "duplicate key 'hosts'" in load_error(path)


def test_proxy_jump_hops_keep_each_user_host_and_port_in_order() -> None:
    assert jump_hops("ops@bastion:2222,[fd00::1]:22,gw") == [
        JumpHop(host="bastion", user="ops", port=2222),
        JumpHop(host="fd00::1", port=22),
        JumpHop(host="gw"),
    ]


# ---- samples and CVS JSON --------------------------------------------------------


def test_two_node_sample_loads() -> None:
    cluster = load_cluster(SAMPLES / "two_node.yaml", check_files=False)
    assert [h.name for h in cluster.hosts] == ["gpu01", "gpu02"]
    assert cluster.container is not None
    assert cluster.container.lifetime == "persistent"
    assert cluster.container.gpus is not None
    assert cluster_warnings(cluster) == []


def test_cvs_sample_loads_with_hosts_and_head() -> None:
    cluster = load_cluster(SAMPLES / "cvs_cluster.json", check_files=False)
    user = getpass.getuser()
    assert [h.name for h in cluster.hosts] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert cluster.head == "10.0.0.1"
    assert cluster.host("10.0.0.1").vpc_address == "192.168.10.1"
    # vpc_ip equal to the address means "no separate VPC".
    assert cluster.host("10.0.0.3").vpc_address is None
    assert cluster.ssh.user == user
    assert cluster.ssh.identity_files == [f"/home/{user}/.ssh/id_rsa"]
    assert cluster.env == {"NCCL_DEBUG": "WARN"}
    container = cluster.container
    assert container is not None
    assert (container.image, container.name, container.lifetime) == (
        "rocm/cvs:latest",
        "cvs_container",
        "persistent",
    )
    # CVS's defaults, with the file's list args appended.
    assert container.cap_add == ["SYS_PTRACE", "IPC_LOCK", "SYS_ADMIN", "SYS_NICE"]
    assert container.ulimits == {"memlock": "-1", "nofile": "1048576"}
    assert container.privileged is True
    assert container.env == {"MULTINODE": "true"}


def cvs_file(tmp_path: Path, **overrides: object) -> Path:
    data: dict[str, object] = {
        "_comment": "x",
        "username": "{user-id}",
        "priv_key_file": "/nonexistent/{user-id}/id_rsa",
        "head_node_dict": {"mgmt_ip": "h2"},
        "node_dict": {"h1": {"bmc_ip": "NA", "vpc_ip": "NA"}, "h2": {"vpc_ip": "h2"}},
        "env_vars": {},
    }
    data.update(overrides)
    return write(tmp_path, json.dumps(data, indent=4), "cluster.json")


def test_cvs_head_and_user_placeholder(tmp_path: Path) -> None:
    cluster = load_cluster(cvs_file(tmp_path), check_files=False)
    assert cluster.head_host.name == "h2"
    assert cluster.ssh.identity_files == [f"/nonexistent/{getpass.getuser()}/id_rsa"]


def test_cvs_missing_key_file_is_named(tmp_path: Path) -> None:
    message = load_error(cvs_file(tmp_path))
    assert "ssh.identity_files[0]" in message
    assert "/nonexistent/" in message


@pytest.mark.parametrize("legacy", ["enabled", "launch"])
def test_cvs_switch_next_to_lifetime_is_refused(tmp_path: Path, legacy: str) -> None:
    container = {"image": "rocm/cvs:latest", "lifetime": "persistent", legacy: True}
    path = cvs_file(tmp_path, orchestrator="container", container=container)
    with pytest.raises(ConfigError, match=f"container.{legacy}: conflicts with container.lifetime"):
        load_cluster(path, check_files=False)


def test_cvs_unknown_runtime_arg_is_named(tmp_path: Path) -> None:
    container = {
        "enabled": True,
        "image": "x",
        "runtime": {"name": "docker", "args": {"capabilitis": ["X"]}},
    }
    path = cvs_file(tmp_path, orchestrator="container", container=container)
    with pytest.raises(ConfigError, match=r"container\.runtime\.args\.capabilitis.*capabilities"):
        load_cluster(path, check_files=False)


def test_cvs_head_not_a_node_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="head"):
        load_cluster(cvs_file(tmp_path, head_node_dict={"mgmt_ip": "h9"}), check_files=False)


def test_cvs_unknown_top_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"usrname.*did you mean 'username'"):
        load_cluster(cvs_file(tmp_path, usrname="x"), check_files=False)


# ---- derived views -----------------------------------------------------------------


def cluster_of(data: dict[str, object]) -> ClusterConfig:
    return cluster_from_data(data, "test.yaml", Path("/tmp"), check_files=False)


def test_container_name_is_explicit_when_set() -> None:
    cluster = cluster_of({"hosts": ["a"], "container": {"image": "x", "name": "mine"}})
    assert container_name(cluster) == "mine"


def test_container_name_is_derived_from_user_and_image() -> None:
    cluster = cluster_of(
        {
            "hosts": ["a"],
            "ssh": {"user": "al.ice@corp"},
            "container": {"image": "registry.io:5000/rocm/pytorch:6.2@sha256:" + "a" * 64},
        }
    )
    assert container_name(cluster) == "cvs-al.ice-corp-pytorch"


def test_persistent_without_name_warns_about_orphans() -> None:
    cluster = cluster_of(
        {
            "hosts": ["a"],
            "limits": {"max_cpus": 2},
            "container": {"image": "x", "lifetime": "persistent"},
        }
    )
    (warning,) = cluster_warnings(cluster)
    assert "orphan" in warning


def test_nothing_capped_warns() -> None:
    cluster = cluster_of({"hosts": ["a"], "container": {"image": "x"}})
    assert cluster_warnings(cluster) == ["no resource caps: containers may take the whole host"]


def test_some_hosts_uncapped_warns_naming_them() -> None:
    cluster = cluster_of(
        {"hosts": [{"name": "a", "limits": {"max_pids": 9}}, "b"], "container": {"image": "x"}}
    )
    (warning,) = cluster_warnings(cluster)
    assert "1 host(s) (b)" in warning


def test_normalized_cluster_expands_hosts_and_fills_defaults() -> None:
    cluster = cluster_of(
        {"hosts": ["n[1-2]"], "ssh": {"user": "u", "port": 2200}, "container": {"image": "x"}}
    )
    out = normalized_cluster(cluster)
    assert "source" not in out
    assert out["head"] == "n1"
    assert out["hosts"] == [
        {"name": "n1", "address": "n1", "port": 2200, "user": "u"},
        {"name": "n2", "address": "n2", "port": 2200, "user": "u"},
    ]
    assert out["container"]["name"] == "cvs-u-x"
    assert out["container"]["lifetime"] == "per_run"
    json.dumps(out)  # plain data


def test_normalized_cluster_masks_every_env_value() -> None:
    cluster = cluster_of(
        {
            "hosts": ["n1"],
            "env": {"API_TOKEN": "t0k3n"},
            "container": {"image": "x", "env": {"HF_TOKEN": "hf"}},
        }
    )
    out = normalized_cluster(cluster)
    assert out["env"] == {"API_TOKEN": "***"} and out["container"]["env"] == {"HF_TOKEN": "***"}
    assert "t0k3n" not in json.dumps(out) and '"hf"' not in json.dumps(out)


# ---- robustness: nothing but ClusterConfig or ConfigError ------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["per_run", "persistent", "all", "16G", "gpu[1-3]", "x", "~/k", ""]),
)
keys = st.one_of(
    st.sampled_from(
        [
            "hosts",
            "head",
            "ssh",
            "container",
            "limits",
            "env",
            "name",
            "port",
            "image",
            "lifetime",
            "resources",
            "gpus",
            "memory",
            "identity_files",
            "node_dict",
            "enabled",
            "setup_script",
        ]
    ),
    st.text(max_size=8),
    st.integers(min_value=-3, max_value=3),
    st.none(),
)
structures = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=25,
)


# Mostly-valid documents with random values in the places that matter, so the
# fuzzing reaches the nested validators and not only the top-level checks.
near_valid = st.fixed_dictionaries(
    {"hosts": st.one_of(st.just(["a", "b[1-2]"]), structures)},
    optional={
        "head": scalars,
        "env": structures,
        "limits": st.one_of(
            st.dictionaries(st.sampled_from(["max_cpus", "max_memory", "max_pids"]), scalars),
            structures,
        ),
        "ssh": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"port": scalars, "user": scalars, "identity_files": structures}
            ),
            structures,
        ),
        "container": st.fixed_dictionaries(
            {"image": st.one_of(st.just("rocm/cvs:1"), scalars)},
            optional={
                "name": scalars,
                "lifetime": scalars,
                "gpus": structures,
                "ulimits": structures,
                "setup_script": scalars,
                "sshd": structures,
                "resources": st.dictionaries(
                    st.sampled_from(["cpus", "memory", "pids", "shm_size", "cpu_shares"]), scalars
                ),
            },
        ),
    },
)


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(structures, near_valid))
def test_random_structures_give_config_or_config_error(data: object) -> None:
    try:
        result = cluster_from_data(data, "fuzz.yaml", Path("/nonexistent"), check_files=True)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("fuzz.yaml")
        return
    assert isinstance(result, ClusterConfig)


@settings(max_examples=examples(200), deadline=None)
@given(st.one_of(structures, near_valid))
def test_random_yaml_documents_give_config_or_config_error(data: object) -> None:
    try:
        text = yaml.safe_dump(data)
    except (yaml.YAMLError, ValueError):
        return
    try:
        parse_cluster(text, "fuzz.yaml", Path("/nonexistent"))
    except ConfigError as exc:
        assert "\n" not in str(exc)


yaml_ish = st.lists(
    st.sampled_from([*"abc:-[]{}!&*|>'\"#%@`,?\n\t 0123\\\ufeff", "hosts", "<<", "\n  "]),
    max_size=40,
).map("".join)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.text(max_size=60), yaml_ish))
def test_random_text_gives_config_or_config_error(text: str) -> None:
    try:
        parse_cluster(text, "fuzz.yaml", Path("/nonexistent"))
    except ConfigError as exc:
        assert "\n" not in str(exc)
        assert str(exc).startswith("fuzz.yaml")


def test_samples_directory_has_readme() -> None:
    assert (SAMPLES / "README.md").is_file()
    assert os.path.getsize(SAMPLES / "README.md") > 200


def test_host_lookup_follows_a_copy_that_replaces_the_hosts() -> None:
    hosts = [{"name": n} for n in ("a", "b", "c")]
    cluster = ClusterConfig.model_validate({"hosts": hosts})
    assert cluster.host("b").name == "b"

    fewer = cluster.model_copy(update={"hosts": cluster.hosts[:1]})

    assert fewer.host("a").name == "a"
    with pytest.raises(KeyError):
        fewer.host("b")
    assert cluster.host("c").name == "c"
    assert cluster == ClusterConfig.model_validate({"hosts": hosts})


def test_the_old_docker_timeout_key_is_read_and_reported_as_deprecated() -> None:
    from orchestrator.config import cluster_from_data, cluster_warnings
    from orchestrator.containers.labels import config_hash

    def load(container: dict[str, object]) -> Any:
        data = {"hosts": ["a"], "container": {"image": "x", **container}}
        return cluster_from_data(data, "c.yaml", Path("/tmp"), check_files=False)

    old, new = load({"docker_timeout": 5}), load({"runtime_timeout": 5})
    assert old.container.runtime_timeout == new.container.runtime_timeout == 5
    assert any("container.docker_timeout is deprecated" in w for w in cluster_warnings(old))
    assert not any("deprecated" in w for w in cluster_warnings(new))
    # A rename changes no running container's hash (no drift warning after it).
    assert config_hash(old.container) == config_hash(new.container)
    with pytest.raises(ConfigError, match="both given: keep runtime_timeout"):
        load({"docker_timeout": 5, "runtime_timeout": 5})


def test_the_unknown_key_message_offers_only_keys_a_user_may_write(tmp_path: Path) -> None:
    error = load_error(write(tmp_path, "name: x\nhosts: [a]\nbogus_key_zz: 1\n"))
    assert "known keys: name, hosts, head, ssh," in error
    for loader_set in ("source", "source_file", "cvs_notes", "slurm"):
        assert loader_set not in error.split("known keys:")[1], error


def test_a_key_the_loader_sets_is_not_suggested_for_a_near_miss(tmp_path: Path) -> None:
    error = load_error(write(tmp_path, "name: x\nhosts: [a]\nsource_fil: f\n"))
    assert "did you mean" not in error and "source_file" not in error.split("known keys:")[1]
