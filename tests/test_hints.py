"""A `docker run` error caused by a cluster-file setting names the key, its line
and the fix (containers/hints.py). The error texts are docker 20.10's and
runc's own, captured from a real dockerd on this machine."""

from __future__ import annotations

import pytest

from orchestrator.config import load_cluster
from orchestrator.config.documents import key_lines
from orchestrator.containers.hints import hint_for

HINT = "\n\nRun 'docker run --help' for more information\n"
OCI = (
    "docker: Error response from daemon: failed to create shim task: OCI runtime create "
    "failed: runc create failed: unable to start container process: "
)
REAL = {
    "memlock": OCI + "error during container init: error setting rlimits for ready process: "
    "error setting rlimit type 8: operation not permitted: unknown" + HINT,
    "group": "docker: Error response from daemon: Unable to find group render: no matching "
    "entries in group file" + HINT,
    "privileged": OCI + "unable to apply caps: operation not permitted: unknown" + HINT,
    "cap": 'docker: Error response from daemon: invalid CapAdd: unknown capability: "CAP_BOGUS"'
    + HINT,
    "device": "docker: Error response from daemon: error gathering device information while "
    'adding custom device "/dev/nonexist": no such file or directory' + HINT,
    "volume": 'docker: Error response from daemon: invalid mount config for type "bind": bind '
    "source path does not exist: /nonexist/y" + HINT,
    "runtime": "docker: Error response from daemon: Unknown runtime specified nvidia" + HINT,
    "seccomp": "docker: opening seccomp profile (/nonexist.json) failed: open /nonexist.json: "
    "no such file or directory" + HINT,
    "security_opt": 'docker: Error response from daemon: invalid --security-opt 2: "bogus=1"'
    + HINT,
    "shm": "docker: Error response from daemon: invalid size: shm size too large" + HINT,
}

CLUSTER = """\
hosts: [node1]
container:
  image: img:1
  privileged: true
  devices: [/dev/kfd, /dev/nonexist]
  cap_add: [SYS_PTRACE, BOGUS]
  security_opt: [seccomp=/nonexist.json, bogus=1]
  group_add: [video, render]
  ulimits:
    stack: 67108864
    memlock: -1
  volumes:
    - /data:/data:ro
    - /nonexist/y:/y
  shm_size: 1000T
  extra_args: [--runtime, nvidia]
"""


@pytest.fixture
def cluster(tmp_path: object) -> tuple[object, dict[str, int]]:
    from pathlib import Path

    path = Path(str(tmp_path)) / "cluster.yaml"
    path.write_text(CLUSTER)
    return load_cluster(path, check_files=False).container, key_lines(CLUSTER, str(path))


@pytest.mark.parametrize(
    ("error", "key", "value", "line", "fix_words"),
    [
        ("memlock", "container.ulimits.memlock", "-1", 11, "does not allow raising memlock"),
        ("group", "container.group_add[1]", "render", 8, "numeric GID"),
        ("privileged", "container.privileged", "true", 4, "privileged: false"),
        ("cap", "container.cap_add[1]", "BOGUS", 6, "does not know this capability"),
        ("device", "container.devices[1]", "/dev/nonexist", 5, "could not open this device"),
        ("volume", "container.volumes[1]", "/nonexist/y:/y", 14, "does not exist"),
        ("runtime", "container.extra_args[1]", "nvidia", 16, "no runtime 'nvidia'"),
        ("seccomp", "container.security_opt[0]", "seccomp=/nonexist.json", 7, "cannot apply"),
        ("security_opt", "container.security_opt[1]", "bogus=1", 7, "cannot apply"),
        ("shm", "container.shm_size", "1000T", 15, "lower it"),
    ],
)
def test_a_docker_error_names_the_setting_its_line_and_the_fix(
    cluster: tuple[object, dict[str, int]],
    error: str,
    key: str,
    value: str,
    line: int,
    fix_words: str,
) -> None:
    cfg, lines = cluster
    hint = hint_for(REAL[error], cfg, lines)  # type: ignore[arg-type]
    assert hint is not None
    assert (hint.key, hint.value, hint.line) == (key, value, line)
    assert fix_words in hint.fix
    assert hint.text("cluster.yaml").startswith(f"{key}: {value} (cluster.yaml:{line}): ")


def test_an_error_no_setting_explains_gets_no_hint(cluster: tuple[object, dict[str, int]]) -> None:
    cfg, lines = cluster
    assert hint_for("docker: Error response from daemon: conflict: name in use", cfg, lines) is None  # type: ignore[arg-type]


def test_a_recognised_error_without_that_setting_gets_no_hint(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text("hosts: [n1]\ncontainer: {image: img:1}\n")
    cfg = load_cluster(path, check_files=False).container
    for text in REAL.values():
        assert hint_for(text, cfg) is None


def test_a_json_cluster_file_gets_the_key_without_a_line(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.json"
    path.write_text('{"hosts": ["n1"], "container": {"image": "i:1", "group_add": ["render"]}}')
    cfg = load_cluster(path, check_files=False).container
    hint = hint_for(REAL["group"], cfg, key_lines(path.read_text(), str(path)))
    assert hint is not None and hint.line is None
    assert hint.text("c.json").startswith("container.group_add[0]: render: ")


def test_a_run_whose_up_failed_names_the_setting_once_for_all_hosts(tmp_path: object) -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from orchestrator.suites.runner import up_failure

    path = Path(str(tmp_path)) / "cluster.yaml"
    path.write_text(CLUSTER)
    cluster = load_cluster(path, check_files=False)
    outcomes = {
        f"node{i}": SimpleNamespace(ok=False, error=f"run: exit code 125\n{cid}\n{REAL['group']}")
        for i, cid in ((1, "a" * 64), (2, "b" * 64))
    }
    report = SimpleNamespace(ok=False, exit_code=1, outcomes=outcomes)
    failure = up_failure(report, cluster)
    assert failure is not None
    code, line = failure
    assert code == 1
    line = str(line)
    assert line.startswith("up failed on node[1-2]: run: exit code 125 <id> docker: Error")
    assert "Unable to find group render" in line and "--help" not in line
    assert line.endswith(
        f"; fix: container.group_add[1]: render ({path}:8): the image has no group 'render' "
        "(docker looks names up inside the container): give its numeric GID instead "
        "(`getent group render` on the host shows it) or remove it"
    )


def test_a_device_glob_is_found_by_the_device_docker_names(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text(
        "hosts: [n1]\ncontainer: {image: i:1, devices: [/dev/kfd, '/dev/infiniband/*']}\n"
    )
    cfg = load_cluster(path, check_files=False).container
    text = REAL["device"].replace("/dev/nonexist", "/dev/infiniband/uverbs0")
    hint = hint_for(text, cfg)
    assert hint is not None and (hint.key, hint.value) == (
        "container.devices[1]",
        "/dev/infiniband/*",
    )
