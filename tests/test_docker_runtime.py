"""Docker argv builders and inspect parsers, proven against a real private dockerd.

`PrivateDockerd` starts its own dockerd in the root network namespace with no
bridge, no iptables and no masquerading, on a socket under a temp dir, and
stops it by pid. The test image is a static busybox imported as a rootfs tar
(`busybox-static`), so no registry or network is needed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from private_dockerd import TEST_IMAGE, PrivateDockerd

from orchestrator.config import ContainerConfig, Registry
from orchestrator.containers.argv import (
    exec_argv,
    image_inspect_argv,
    load_argv,
    login_argv,
    login_command,
    pull_argv,
    run_argv,
    run_env_file,
    start_argv,
    validate_container_name,
)
from orchestrator.containers.inspection import (
    RuntimeOutputError,
    parse_container_inspect,
    parse_image_inspect,
)
from orchestrator.containers.labels import (
    LABEL_CONFIG_HASH,
    LABEL_OWNER,
    config_hash,
    is_ours,
    managed_labels,
)
from orchestrator.containers.runtime_errors import classify_runtime_error
from orchestrator.limits.gpus import GPU, GPUSelection
from orchestrator.limits.resources import EffectiveResources
from orchestrator.remote.runtime import ContainerRuntime

# --- pure builders ---------------------------------------------------------

HOSTILE = "a; rm -rf / $(id) `id` 'q' \"d\" | & > <\n*"
# Container env reaches `docker run` through an env file: one line per value.
HOSTILE_LINE = HOSTILE.replace("\n", " ")


def container_inspect(name: str) -> list[str]:
    """The test's look at a container (`--type container`: not an image of that name)."""
    return ["docker", "inspect", "--type", "container", name]


def test_docker_runtime_prefix_direct_is_plain_docker() -> None:
    assert ContainerRuntime("direct").prefix == ["docker"]


def test_docker_runtime_prefix_sudo_never_prompts() -> None:
    assert ContainerRuntime("sudo").prefix == ["sudo", "-n", "docker"]


def test_docker_runtime_prefix_rejects_no_access() -> None:
    with pytest.raises(ValueError):
        _ = ContainerRuntime().prefix  # not probed: no prefix to give


def test_run_argv_puts_every_option_before_image_and_sleep_infinity() -> None:
    cfg = ContainerConfig(
        image="registry.example:5000/team/img:1.2",
        name="c1",
        network="host",
        ipc="host",
        privileged=True,
        devices=["/dev/kfd"],
        cap_add=["SYS_PTRACE"],
        security_opt=["seccomp=unconfined"],
        group_add=["video"],
        ulimits={"memlock": -1, "stack": "67108864"},
        volumes=["/data:/data:ro"],
        env={"A": "1"},
        shm_size="16g",
        extra_args=["--init"],
    )
    argv = run_argv(["docker"], cfg, "c1", {"k": "v"}, resources=EffectiveResources(cpus=2))
    assert argv == [
        "docker", "run", "-d", "--init", "--name", "c1",
        "--label", "k=v",
        "--network", "host",
        "--ipc", "host",
        "--privileged",
        "--device", "/dev/kfd",
        "--cap-add", "SYS_PTRACE",
        "--security-opt", "seccomp=unconfined",
        "--group-add", "video",
        "--ulimit", "memlock=-1",
        "--ulimit", "stack=67108864",
        "-v", "/data:/data:ro",
        "--env-file", "/dev/stdin",
        "--shm-size", "16g",
        "--cpus", "2",
        "--init",
        "registry.example:5000/team/img:1.2", "sleep", "infinity",
    ]  # fmt: skip


def test_run_argv_puts_caps_then_gpu_devices_and_env_before_the_operators_extra_args() -> None:
    cfg = ContainerConfig(image="img:1", env={"A": "1"}, extra_args=["--init"])
    gpus = GPUSelection(
        vendor="amd", gpus=(GPU(vendor="amd", index=1, render_node="/dev/dri/renderD129"),)
    )
    argv = run_argv(["docker"], cfg, "c", {}, resources=EffectiveResources(pids=64), gpus=gpus)
    tail = argv[argv.index("/dev/stdin") + 1 :]
    assert tail == [
        "--pids-limit", "64",
        "--device", "/dev/kfd", "--device", "/dev/dri/renderD129",
        "-e", "ROCR_VISIBLE_DEVICES=0",
        "--init",
        "img:1", "sleep", "infinity",
    ]  # fmt: skip


def test_run_argv_leaves_out_options_that_are_not_set() -> None:
    # A non-root user: no Open MPI run-as-root variables, so no env file either.
    cfg = ContainerConfig(image="img:1", ipc=None, user="app")
    argv = run_argv(["sudo", "-n", "docker"], cfg, "c", {})
    assert argv == [
        "sudo", "-n", "docker", "run", "-d", "--init", "--name", "c", "--network", "host",
        "img:1", "sleep", "infinity",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "name", ["x;rm -rf /", "a b", "$(id)", "`id`", "a|b", "a&b", "-rf", "", "a\nb", "é"]
)
def test_container_name_with_shell_metacharacters_is_rejected(name: str) -> None:
    cfg = ContainerConfig(image="img:1")
    with pytest.raises(ValueError, match="invalid container name"):
        run_argv(["docker"], cfg, name, {})
    with pytest.raises(ValueError):
        start_argv(["docker"], name)
    with pytest.raises(ValueError):
        exec_argv(["docker"], name, ["true"])


@pytest.mark.parametrize("ref", ["img:1;id", "img:$(id)", "IMG", "img 1", "-img"])
def test_image_ref_with_shell_metacharacters_is_rejected(ref: str) -> None:
    # model_construct skips the config's own validation: the builder checks again.
    cfg = ContainerConfig.model_construct(
        **{**ContainerConfig(image="img:1").__dict__, "image": ref}
    )
    with pytest.raises(ValueError, match="invalid image reference"):
        run_argv(["docker"], cfg, "c", {})
    with pytest.raises(ValueError):
        pull_argv(["docker"], ref)
    with pytest.raises(ValueError):
        image_inspect_argv(["docker"], ref)


def test_image_inspect_accepts_an_image_id() -> None:
    iid = "sha256:" + "ab" * 32
    assert image_inspect_argv(["docker"], iid) == ["docker", "image", "inspect", iid]


def test_hostile_values_survive_one_round_of_shell_quoting() -> None:
    # The model refuses control characters in volumes and extra_args (tests/test_config.py);
    # model_construct skips that to check the quoting on its own.
    cfg = ContainerConfig.model_construct(
        **{
            **ContainerConfig(image="img:1").__dict__,
            "env": {"X": HOSTILE},
            "volumes": [f"/tmp/{HOSTILE}:/x"],
            "extra_args": [HOSTILE],
        }
    )
    argv = run_argv(["docker"], cfg, "c", {"k": HOSTILE.replace("\n", "")})
    assert shlex.split(shlex.join(argv)) == argv


@pytest.mark.parametrize("key", ["a=b", "", "a b"])
def test_label_key_docker_would_misparse_is_rejected(key: str) -> None:
    with pytest.raises(ValueError, match="label"):
        run_argv(["docker"], ContainerConfig(image="img:1"), "c", {key: "v"})


def test_login_reads_password_from_stdin_never_argv() -> None:
    argv = login_argv(["docker"], "bob", "reg.example")
    assert argv == [
        "docker", "login", "--username", "bob", "--password-stdin", "reg.example"
    ]  # fmt: skip
    registry = Registry(username="bob", password_file="/etc/cvs/pw file", server=None)
    assert login_command(["sudo", "-n", "docker"], registry) == (
        "sudo -n docker login --username bob --password-stdin < '/etc/cvs/pw file'"
    )


def test_registry_tls_verify_false_gives_podman_login_and_pull_no_tls_verify() -> None:
    registry = Registry(username="bob", password_file="/pw", server="10.0.0.1:5000")
    assert login_command(["podman"], registry, tls_verify=False) == (
        "podman login --tls-verify=false --username bob --password-stdin 10.0.0.1:5000 < /pw"
    )
    assert pull_argv(["podman"], "10.0.0.1:5000/i:1", tls_verify=False) == [
        "podman", "pull", "--tls-verify=false", "10.0.0.1:5000/i:1"
    ]  # fmt: skip


def test_registry_tls_verify_false_with_docker_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"needs runtime: podman.*insecure-registries"):
        ContainerConfig(image="img:1", registry_tls_verify=False)
    podman = ContainerConfig(image="i:1", runtime="podman", registry_tls_verify=False)
    assert not podman.registry_tls_verify


def test_exec_argv_places_options_before_name_and_command() -> None:
    argv = exec_argv(
        ["docker"], "c", ["sh", "-c", "echo $X"], interactive=True, user="1000", env={"X": "1"}
    )
    assert argv == ["docker", "exec", "-i", "-u", "1000", "-e", "X=1", "c", "sh", "-c", "echo $X"]


def test_simple_lifecycle_argvs() -> None:
    assert start_argv(["docker"], "c") == ["docker", "start", "c"]
    assert pull_argv(["docker"], "img:1") == ["docker", "pull", "img:1"]
    assert load_argv(["docker"], "/x/img.tar") == ["docker", "load", "-i", "/x/img.tar"]


def test_managed_labels_are_recognised_as_ours_only_for_the_same_cluster() -> None:
    labels = managed_labels("alpha", "abc")
    assert labels == {LABEL_OWNER: "alpha", LABEL_CONFIG_HASH: "abc"}
    assert is_ours(labels, "alpha")
    assert not is_ours(labels, "beta")
    assert not is_ours({}, "alpha")


def test_config_hash_changes_with_the_container_block() -> None:
    a = ContainerConfig(image="img:1")
    assert config_hash(a) == config_hash(ContainerConfig(image="img:1"))
    assert config_hash(a) != config_hash(ContainerConfig(image="img:2"))


def test_validate_container_name_returns_good_name() -> None:
    assert validate_container_name("cvs_gpu-1.x") == "cvs_gpu-1.x"


# --- pure parsers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("stderr", "rc", "kind"),
    [
        ("Error: No such object: c", 1, "not_found"),
        ("Error response from daemon: No such container: c", 1, "not_found"),
        ("Error response from daemon: no such image: x:1: No such image: x:1", 1, "not_found"),
        (
            "Cannot connect to the Docker daemon at unix:///x.sock. Is the docker daemon running?",
            1,
            "daemon_down",
        ),
        (
            "permission denied while trying to connect to the Docker daemon socket at "
            "unix:///var/run/docker.sock",
            1,
            "permission_denied",
        ),
        ("sh: 1: docker: not found", 127, "not_installed"),
        ("bash: docker: command not found", 127, "not_installed"),
        ("something else", 1, "other"),
    ],
)
def test_classify_runtime_error(stderr: str, rc: int, kind: str) -> None:
    assert classify_runtime_error(stderr, rc) == kind


@pytest.mark.parametrize("text", ["", "not json", "[]", "[1]", '[{"Id": "x"}]', "{}"])
def test_container_inspect_parser_rejects_what_is_not_a_container(text: str) -> None:
    with pytest.raises(RuntimeOutputError):
        parse_container_inspect(text)


@pytest.mark.parametrize("text", ["", "[]", '[{"RepoTags": []}]'])
def test_image_inspect_parser_rejects_what_is_not_an_image(text: str) -> None:
    with pytest.raises(RuntimeOutputError):
        parse_image_inspect(text)


@pytest.mark.parametrize("value", [None, 0, -1])
def test_unset_pids_limit_reads_as_none_across_engine_versions(value: int | None) -> None:
    doc = [{"Id": "x", "State": {"Status": "running", "Running": True}, "HostConfig": {}}]
    doc[0]["HostConfig"]["PidsLimit"] = value
    assert parse_container_inspect(json.dumps(doc)).limits.pids_limit is None


def test_never_started_container_has_no_start_time_and_counts_as_exited() -> None:
    doc = [
        {
            "Id": "x",
            "State": {"Status": "created", "Running": False, "StartedAt": "0001-01-01T00:00:00Z"},
        }
    ]
    info = parse_container_inspect(json.dumps(doc))
    assert info.started_at is None
    assert info.state == "exited"


# --- against the real dockerd ---------------------------------------------

pytestmark_real = pytest.mark.sandbox


@pytestmark_real
def test_run_argv_settings_come_back_from_docker_inspect(
    dockerd: PrivateDockerd, image_id: str, tmp_path: Path
) -> None:
    (tmp_path / "vol").mkdir()
    cfg = ContainerConfig(
        image=TEST_IMAGE,
        network="none",
        ipc="private",
        devices=["/dev/null:/dev/cvsnull"],
        cap_add=["SYS_PTRACE"],
        security_opt=["no-new-privileges"],
        group_add=["1234"],
        ulimits={"nofile": "1024:2048"},
        volumes=[f"{tmp_path / 'vol'}:/data:ro"],
        env={"HOSTILE": HOSTILE_LINE},
        shm_size="32m",
    )
    limits = EffectiveResources(
        cpus=0.5,
        memory_bytes=64 * 1024**2,
        memory_reservation_bytes=32 * 1024**2,
        cpu_shares=512,
        pids=50,
    )
    labels = managed_labels("alpha", "h1")
    argv = run_argv(["docker"], cfg, "settings", labels, resources=limits)
    assert HOSTILE_LINE not in " ".join(argv)  # the value goes over stdin, not argv
    subprocess.run(
        ["sh", "-c", shlex.join(argv)],
        input=run_env_file(cfg),
        env=dockerd.env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    try:
        info = parse_container_inspect(dockerd.run_argv(container_inspect("settings")).stdout)
        assert info.name == "settings"
        assert info.running and info.state == "running"
        assert info.image_id == image_id
        assert info.image_ref == TEST_IMAGE
        assert dict(info.labels) == labels
        assert info.started_at and info.started_at.startswith("20")
        assert info.limits.nano_cpus == 500_000_000
        assert info.limits.memory == 64 * 2**20
        assert info.limits.memory_reservation == 32 * 2**20
        assert info.limits.cpu_shares == 512
        assert info.limits.pids_limit == 50
        assert info.limits.shm_size == 32 * 2**20
        assert [(d.path_on_host, d.path_in_container) for d in info.limits.devices] == [
            ("/dev/null", "/dev/cvsnull")
        ]
        env = dockerd.run_argv(
            exec_argv(["docker"], "settings", ["sh", "-c", 'printf "%s\\n" "$HOSTILE"'])
        ).stdout
        assert env == HOSTILE_LINE + "\n"
    finally:
        dockerd.run_argv(["docker", "rm", "-f", "settings"])


@pytestmark_real
def test_exec_argv_passes_user_env_and_stdin(dockerd: PrivateDockerd, image_id: str) -> None:
    cfg = ContainerConfig(image=TEST_IMAGE, network="none", ipc=None)
    dockerd.run_argv(run_argv(["docker"], cfg, "execer", {}))
    try:
        argv = exec_argv(
            ["docker"],
            "execer",
            ["sh", "-c", 'echo "$(id -u) $X $(cat)"'],
            interactive=True,
            user="4321",
            env={"X": "x;y"},
        )
        out = subprocess.run(
            ["sh", "-c", shlex.join(argv)],
            input="from-stdin",
            env=dockerd.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out == "4321 x;y from-stdin\n"
    finally:
        dockerd.run_argv(["docker", "rm", "-f", "execer"])


@pytestmark_real
def test_stop_then_start_keeps_the_overlay_and_rm_makes_it_absent(
    dockerd: PrivateDockerd, image_id: str
) -> None:
    cfg = ContainerConfig(image=TEST_IMAGE, network="none", ipc=None)
    dockerd.run_argv(run_argv(["docker"], cfg, "keeper", {}))
    dockerd.run_argv(exec_argv(["docker"], "keeper", ["sh", "-c", "echo kept > /kept"]))
    dockerd.run_argv(["docker", "stop", "-t", "1", "keeper"])
    stopped = parse_container_inspect(dockerd.run_argv(container_inspect("keeper")).stdout)
    assert stopped.state == "exited"
    dockerd.run_argv(start_argv(["docker"], "keeper"))
    again = parse_container_inspect(dockerd.run_argv(container_inspect("keeper")).stdout)
    assert again.id == stopped.id and again.state == "running"
    assert dockerd.run_argv(exec_argv(["docker"], "keeper", ["cat", "/kept"])).stdout == "kept\n"
    dockerd.run_argv(["docker", "rm", "-f", "keeper"])
    gone = dockerd.run_argv(container_inspect("keeper"), check=False)
    assert gone.returncode != 0
    assert classify_runtime_error(gone.stderr, gone.returncode) == "not_found"


@pytestmark_real
def test_image_inspect_and_load_round_trip_keeps_the_id(
    dockerd: PrivateDockerd, image_id: str, tmp_path: Path
) -> None:
    info = parse_image_inspect(dockerd.run_argv(image_inspect_argv(["docker"], TEST_IMAGE)).stdout)
    assert info.id == image_id
    assert TEST_IMAGE in info.repo_tags
    assert info.repo_digests == ()  # imported, never pushed or pulled
    tar = tmp_path / "img.tar"
    dockerd.docker("save", "-o", str(tar), TEST_IMAGE)
    dockerd.docker("rmi", TEST_IMAGE)
    missing = dockerd.run_argv(image_inspect_argv(["docker"], TEST_IMAGE), check=False)
    assert classify_runtime_error(missing.stderr, missing.returncode) == "not_found"
    dockerd.run_argv(load_argv(["docker"], str(tar)))
    reloaded = dockerd.run_argv(image_inspect_argv(["docker"], TEST_IMAGE)).stdout
    assert parse_image_inspect(reloaded).id == image_id


@pytestmark_real
def test_daemon_down_is_classified_apart_from_not_found(tmp_path: Path) -> None:
    if not shutil.which("docker"):
        pytest.skip("no docker CLI")
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    out = subprocess.run(
        ["sh", "-c", shlex.join(container_inspect("c"))],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert classify_runtime_error(out.stderr, out.returncode) == "daemon_down"
