"""Podman as the container runtime, end to end on the sandbox (issue 24).

A sandbox of its own whose three nodes run rootful podman (a store per host,
reached by the sudo login user through `sudo -n podman`; sandbox/podman.py),
driven through the real CLI. Each test has its own container name and
removes its containers from every host afterwards, also on failure.

CDI tests write spec files into the machine-wide /etc/cdi: uniquely named,
removed after, and serialised with other runs by a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import CVS, cvs_on, explain, last_json
from clitools import cvs as cli
from labtools import THREE, Lab, inspect, wait_for_holders
from labtools import docker as podman
from terminal import Tmux

from orchestrator.sandbox import DOCKER_USER, SSHD_TAG, Sandbox, sandbox_down, sandbox_up
from orchestrator.sandbox.images import images_tar
from orchestrator.sandbox.registry import SandboxRegistry

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parent.parent
CDI_DIR = Path("/etc/cdi")
CDI_LOCK = Path("/run/cvs-sandbox-cdi.lock")


cvs = partial(cvs_on, timeout=240)


def cvs_json(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = cvs(path, "--json", *args)
    return proc.returncode, last_json(proc)


@pytest.fixture(scope="module")
def podman_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("sandbox tests need root")
    if shutil.which("podman") is None:
        pytest.skip("podman hosts need podman (apt-get install podman uidmap)")
    directory = tmp_path_factory.mktemp("podman") / "sb"
    try:
        yield sandbox_up(directory, hosts=3, runtime="podman")
    finally:
        sandbox_down(directory)


def ids(sb: Sandbox, name: str, hosts: list[str] = THREE) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for host in hosts:
        doc = inspect(sb, host, name)
        out[host] = None if doc is None else doc["Id"]
    return out


@pytest.fixture
def lab(podman_sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    name = f"cvs-pm-{uuid.uuid4().hex[:8]}"
    lab = Lab(podman_sandbox, tmp_path, name=name, top={"name": name})  # the cluster named so too
    try:
        yield lab
    finally:
        lab.clean()


# --- lifetimes -----------------------------------------------------------------


def test_podman_cold_start_then_attach_keeps_the_same_containers(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent")

    rc, first = cvs_json(path, "up")
    assert rc == 0, first
    assert {h: v["action"] for h, v in first["hosts"].items()} == dict.fromkeys(THREE, "cold_start")
    before = ids(lab.sb, lab.name)
    assert all(before.values())
    wrote = cvs(path, "exec", "--", "echo data > /root/keep")
    assert wrote.returncode == 0, explain(wrote)

    rc, second = cvs_json(path, "up")

    assert rc == 0, second
    assert {h: v["action"] for h, v in second["hosts"].items()} == dict.fromkeys(THREE, "attach")
    assert all(v["steps"] == {} for v in second["hosts"].values()), second
    assert ids(lab.sb, lab.name) == before
    read = cvs(path, "exec", "--", "cat /root/keep")
    assert read.returncode == 0 and read.stdout.count("data") == 3, explain(read)


def test_podman_restart_after_a_stop_keeps_the_overlay(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent")
    assert cvs(path, "up").returncode == 0
    assert cvs(path, "exec", "--", "echo kept > /root/keep").returncode == 0
    before = ids(lab.sb, lab.name)
    for host in THREE:
        podman(lab.sb, host, "stop", "-t", "1", lab.name)

    rc, report = cvs_json(path, "up")

    assert rc == 0, report
    assert {h: v["action"] for h, v in report["hosts"].items()} == dict.fromkeys(THREE, "restart")
    assert ids(lab.sb, lab.name) == before
    read = cvs(path, "exec", "--", "cat /root/keep")
    assert read.stdout.count("kept") == 3, explain(read)


def test_podman_partial_persistent_set_is_refused_and_nothing_changes(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent")
    assert cvs(path, "up").returncode == 0
    podman(lab.sb, "node2", "rm", "-f", "-t", "0", lab.name)
    before = ids(lab.sb, lab.name)

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "absent: node2" in up.stderr, up.stderr
    assert ids(lab.sb, lab.name) == before


# --- image identity ------------------------------------------------------------


def test_podman_image_skew_is_refused_naming_host_and_image(lab: Lab) -> None:
    tag = f"localhost/cvs-skew-{lab.name[-8:]}:test"
    lab.tags.append(tag)
    for host in THREE:
        podman(lab.sb, host, "tag", SSHD_TAG, tag)
    path = lab.cluster(lifetime="persistent", image=tag)
    assert cvs(path, "up").returncode == 0
    labels = inspect(lab.sb, "node1", lab.name)["Config"]["Labels"]  # type: ignore[index]
    skewed = lab.sb.import_skewed_image("node1", tag)
    podman(lab.sb, "node1", "rm", "-f", "-t", "0", lab.name)
    label_args = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
    podman(lab.sb, "node1", "run", "-d", "--name", lab.name, "--network", "host",
           *label_args, tag, "sleep", "infinity")  # fmt: skip
    normal = lab.sb.image_id("node2", tag)
    assert skewed != normal and skewed.startswith("sha256:")

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "image skew" in up.stderr
    assert f"{skewed.removeprefix('sha256:')[:12]} on node1" in up.stderr, up.stderr
    assert f"{normal.removeprefix('sha256:')[:12]} on node2, node3" in up.stderr


def test_podman_cold_start_refuses_a_tag_that_names_different_images(lab: Lab) -> None:
    tag = f"localhost/cvs-skew-{lab.name[-8:]}:cold"
    lab.tags.append(tag)
    skewed = lab.sb.import_skewed_image("node1", tag)
    for host in ("node2", "node3"):
        podman(lab.sb, host, "tag", SSHD_TAG, tag)
    path = lab.cluster(lifetime="persistent", image=tag)

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "resolves to different images" in up.stderr, up.stderr
    assert skewed.removeprefix("sha256:")[:12] in up.stderr
    assert ids(lab.sb, lab.name) == dict.fromkeys(THREE)


# --- ownership ---------------------------------------------------------------------


def test_podman_per_run_labels_its_containers_and_down_removes_them_by_id(lab: Lab) -> None:
    path = lab.cluster(lifetime="per_run")
    assert cvs(path, "up").returncode == 0
    for host in THREE:
        doc = inspect(lab.sb, host, lab.name)
        assert doc is not None and doc["Config"]["Labels"]["io.cvs.managed"]

    down = cvs(path, "down")

    assert down.returncode == 0, explain(down)
    assert ids(lab.sb, lab.name) == dict.fromkeys(THREE)


def test_podman_foreign_same_named_container_is_never_removed(lab: Lab) -> None:
    podman(lab.sb, "node1", "run", "-d", "--name", lab.name, SSHD_TAG, "sleep", "infinity")
    foreign = ids(lab.sb, lab.name, ["node1"])["node1"]
    path = lab.cluster(lifetime="per_run")

    up = cvs(path, "up")
    down = cvs(path, "down")

    assert up.returncode == 4 and "node1" in up.stderr, explain(up)
    assert down.returncode == 0 and "not created by cvs" in down.stdout + down.stderr, explain(down)
    assert ids(lab.sb, lab.name) == {"node1": foreign, "node2": None, "node3": None}


# --- exec, provisioning, sshd, caps --------------------------------------------------


def test_podman_exec_runs_in_each_container_and_passes_the_exit_code(lab: Lab) -> None:
    path = lab.cluster(lifetime="per_run")
    assert cvs(path, "up").returncode == 0

    names = cvs(path, "exec", "--", "hostname")
    failed = cvs(path, "exec", "--", "exit 3")

    assert names.returncode == 0, explain(names)
    assert {f"{h} | {h}" for h in THREE} <= set(names.stdout.splitlines())
    assert failed.returncode == 1, explain(failed)


def test_podman_provisioning_and_in_container_sshd_reach_the_peers(lab: Lab) -> None:
    path = lab.cluster(lifetime="per_run", sshd_port=2461)
    rc, report = cvs_json(path, "up")
    assert rc == 0, report
    assert all(v["steps"].get("sshd") == "ok" for v in report["hosts"].values()), report

    hop = cvs(path, "exec", "--hosts", "node1", "--", "ssh -o BatchMode=yes node3 hostname")

    assert hop.returncode == 0, explain(hop)
    assert "node1 | node3" in hop.stdout.splitlines()
    status = cvs_json(path, "status")[1]
    assert {h: v["sshd"] for h, v in status["hosts"].items()} == dict.fromkeys(THREE, "listening")
    assert {h: v["provisioned"] for h, v in status["hosts"].items()} == dict.fromkeys(THREE, "yes")


def test_podman_resource_caps_reach_the_container_and_an_attach_sees_no_drift(lab: Lab) -> None:
    path = lab.cluster(
        lifetime="persistent", hosts=["node1"], resources={"memory": "256Mi", "pids": 300}
    )
    assert cvs(path, "up").returncode == 0
    host_config = inspect(lab.sb, "node1", lab.name)["HostConfig"]  # type: ignore[index]
    assert (host_config["Memory"], host_config["PidsLimit"]) == (256 * 1024**2, 300)

    attach = cvs(path, "up")

    assert attach.returncode == 0, explain(attach)
    assert "drift" not in attach.stderr, attach.stderr


def test_podman_unset_limits_are_not_read_as_drift(lab: Lab) -> None:
    # podman's own defaults (PidsLimit 2048, ShmSize 62.5 MiB) are "unset".
    path = lab.cluster(lifetime="persistent", hosts=["node1"])
    assert cvs(path, "up").returncode == 0

    attach = cvs(path, "up")

    assert attach.returncode == 0 and "drift" not in attach.stderr, explain(attach)


# --- a mixed fleet ---------------------------------------------------------------------


def test_a_docker_cluster_on_podman_hosts_is_refused_naming_both_runtimes(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", runtime="docker")

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "docker daemon not reachable" in up.stderr, up.stderr
    assert "this host has podman" in up.stderr and "container.runtime: podman" in up.stderr
    assert ids(lab.sb, lab.name) == dict.fromkeys(THREE)


# --- GPUs through CDI ------------------------------------------------------------------


@contextlib.contextmanager
def cdi_spec(devices: dict[str, list[str]], *, kind: str = "amd.com/gpu") -> Iterator[Path]:
    """A CDI spec in /etc/cdi for the duration, under a lock other runs also
    take: /etc/cdi is machine-wide, and two specs naming one device would
    make both ambiguous."""
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    with open(CDI_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = CDI_DIR / f"cvs-test-{uuid.uuid4().hex[:8]}.yaml"
        spec = {
            "cdiVersion": "0.5.0",
            "kind": kind,
            "devices": [
                {
                    "name": name,
                    "containerEdits": {
                        "deviceNodes": [
                            {"path": "/dev/dri/" + Path(n).name, "hostPath": n} for n in nodes
                        ],
                    },
                }
                for name, nodes in devices.items()
            ],
            "containerEdits": {"env": ["ROCR_VISIBLE_DEVICES=7"]},
        }
        path.write_text(yaml.safe_dump(spec))
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)


@pytest.fixture
def device_root() -> Iterator[Path]:
    """/dev/kfd and renderD128..130 as stand-ins (/dev/null's numbers)."""
    root = Path(tempfile.mkdtemp(prefix="cvs-cdi-root-", dir="/tmp"))
    root.chmod(0o755)
    (root / "dev" / "dri").mkdir(parents=True)
    os.mknod(root / "dev" / "kfd", 0o666 | 0o020000, os.makedev(1, 3))
    for minor in (128, 129, 130):
        os.mknod(root / "dev" / "dri" / f"renderD{minor}", 0o666 | 0o020000, os.makedev(1, 3))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_podman_gpus_go_through_cdi_names_and_the_container_sees_only_them(
    lab: Lab, device_root: Path
) -> None:
    nodes = {str(i): [f"{device_root}/dev/dri/renderD{128 + i}"] for i in range(3)}
    nodes["all"] = [n[0] for n in nodes.values()]
    with cdi_spec(nodes):
        path = lab.cluster(
            lifetime="per_run",
            hosts=["node1"],
            gpus={"count": 2},
            host_extra={"node1": {"gpu_device_root": str(device_root)}},
        )
        up = cvs(path, "up")
        assert up.returncode == 0, explain(up)
        assert "GPUs through CDI: amd.com/gpu=0,1" in up.stderr, up.stderr
        create = inspect(lab.sb, "node1", lab.name)["Config"]["CreateCommand"]  # type: ignore[index]
        inside = cvs(path, "exec", "--", "ls /dev/dri; echo ROCR=$ROCR_VISIBLE_DEVICES")

    assert create[create.index("amd.com/gpu=0") - 1 :][:2] == ["--device", "amd.com/gpu=0"]
    assert "amd.com/gpu=all" not in create
    lines = [line.split(" | ", 1)[1] for line in inside.stdout.splitlines() if " | " in line]
    assert [x for x in lines if x.startswith("renderD")] == ["renderD128", "renderD129"]
    # The spec's own ROCR_VISIBLE_DEVICES (host numbering) loses to cvs's 0..N-1.
    assert "ROCR=0,1" in lines, inside.stdout


def test_cdi_always_without_a_covering_spec_refuses_before_anything_starts(
    lab: Lab, device_root: Path
) -> None:
    path = lab.cluster(
        lifetime="per_run",
        hosts=["node1"],
        gpus={"count": 1},
        cdi="always",
        host_extra={"node1": {"gpu_device_root": str(device_root)}},
    )

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "container.cdi: always, but no CDI device" in up.stderr, up.stderr
    assert ids(lab.sb, lab.name, ["node1"]) == {"node1": None}


# --- rootless: the login user's own podman, no sudo -----------------------------------


@pytest.fixture(scope="module")
def rootless_images(podman_sandbox: Sandbox) -> Iterator[str]:
    """The sandbox images in the docker-group user's rootless store on node1,
    loaded by that user over SSH (a rootless store's files belong to the
    user's subordinate IDs: the root-owned template cannot be linked in)."""
    with open(images_tar(), "rb") as tar:
        proc = subprocess.run(
            [*podman_sandbox.ssh_argv("node1", DOCKER_USER), "podman load -q"],
            stdin=tar,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr
    # The host's own rootless store, not one in the user's home shared by all.
    home = Path(pwd.getpwnam(DOCKER_USER).pw_dir)
    assert not (home / ".local" / "share" / "containers" / "storage").exists()
    try:
        yield "node1"
    finally:
        # podman's blob-info cache is all a rootless load leaves in the home.
        shutil.rmtree(home / ".local" / "share" / "containers", ignore_errors=True)


def rootless_cluster(lab: Lab, **container: Any) -> Path:
    path = lab.cluster(lifetime="persistent", hosts=["node1"], rootless=True, **container)
    doc = yaml.safe_load(path.read_text())
    doc["ssh"]["user"] = DOCKER_USER
    # This machine has no /dev/mqueue, which rootless `--ipc host` bind-mounts.
    doc["container"]["ipc"] = None
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rootless_ps(sb: Sandbox, name: str) -> str:
    proc = subprocess.run(
        [
            *sb.ssh_argv("node1", DOCKER_USER),
            f"podman ps -a --format '{{{{.ID}}}}' -f name=^{name}$",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.stdout.strip()


def test_rootless_podman_cold_starts_attaches_and_provisions_as_root_in_its_namespace(
    lab: Lab, rootless_images: str
) -> None:
    path = rootless_cluster(lab)
    try:
        rc, first = cvs_json(path, "up")
        assert rc == 0, first
        assert first["hosts"]["node1"]["action"] == "cold_start"
        assert first["hosts"]["node1"]["steps"].get("provision") == "ok"
        started = rootless_ps(lab.sb, lab.name)
        # The rootful store (sudo) does not have it: this is the user's own.
        assert started and inspect(lab.sb, "node1", lab.name) is None

        rc, second = cvs_json(path, "up")
        inside = cvs(path, "exec", "--", "id -u; cat /proc/self/uid_map")

        assert rc == 0 and second["hosts"]["node1"]["action"] == "attach", second
        assert rootless_ps(lab.sb, lab.name) == started
        lines = [ln.split(" | ", 1)[1].split() for ln in inside.stdout.splitlines() if " | " in ln]
        assert lines[0] == ["0"]  # root inside ...
        assert lines[1][:2] == ["0", str(pwd.getpwnam(DOCKER_USER).pw_uid)]  # ... is cvs outside
    finally:
        cvs(path, "down", "--force")


def test_rootless_caps_the_host_cannot_apply_are_refused_before_anything_starts(
    lab: Lab, rootless_images: str
) -> None:
    # This machine runs cgroups v1 (hybrid): rootless podman would ignore them.
    path = rootless_cluster(lab, resources={"memory": "256Mi"})

    validate = cvs(path, "validate")
    up = cvs(path, "up")

    assert "rootless: resources.memory apply only on cgroups v2" in validate.stderr
    assert up.returncode == 4, explain(up)
    assert "rootless podman cannot apply resources.memory on cgroups v1" in up.stderr
    assert rootless_ps(lab.sb, lab.name) == ""


# --- cp and image_tar ------------------------------------------------------------------


def test_podman_cp_copies_into_every_container_checked_by_sha256(lab: Lab, tmp_path: Path) -> None:
    path = lab.cluster(lifetime="per_run")
    assert cvs(path, "up").returncode == 0
    src = tmp_path / "payload.txt"
    src.write_text("podman payload\n")

    copied = cvs(path, "cp", str(src), "/opt/")
    read = cvs(path, "exec", "--", "cat /opt/payload.txt")

    assert copied.returncode == 0, explain(copied)
    assert read.stdout.count("podman payload") == 3, explain(read)


def test_podman_loads_image_tar_where_the_tag_is_missing(lab: Lab) -> None:
    tag = f"localhost/cvs-tar-{lab.name[-8:]}:1"
    lab.tags.append(tag)
    podman(lab.sb, "node1", "tag", SSHD_TAG, tag)
    tar = Path(tempfile.mkdtemp(prefix="cvs-tar-", dir="/tmp")) / "image.tar"
    try:
        podman(lab.sb, "node1", "save", "-o", str(tar), tag)
        podman(lab.sb, "node1", "rmi", tag)
        path = lab.cluster(lifetime="per_run", hosts=["node1", "node2"], image=tag)
        doc = yaml.safe_load(path.read_text())
        doc["container"].update(image_tar=str(tar), pull="never", distribute="registry")
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

        rc, report = cvs_json(path, "up")

        assert rc == 0, report
        assert all(v["steps"].get("load") == "ok" for v in report["hosts"].values()), report
        assert lab.sb.image_id("node1", tag) == lab.sb.image_id("node2", tag)
    finally:
        shutil.rmtree(tar.parent, ignore_errors=True)


# --- suites --------------------------------------------------------------------------------


def test_podman_install_then_test_suite_in_a_new_process_passes(lab: Lab, tmp_path: Path) -> None:
    path = lab.cluster(lifetime="persistent")
    install = cvs(path, "run", "install_demo", "--run-dir", str(tmp_path / "install"))
    after = cvs(path, "run", "test_demo", "--run-dir", str(tmp_path / "after"))

    assert install.returncode == 0, explain(install)
    assert after.returncode == 0, explain(after)
    doc = json.loads((tmp_path / "after" / "results.json").read_text())
    # The report's image IDs read as docker prints them (podman's are bare hex).
    image_ids = json.dumps(doc)
    assert "sha256:" + lab.sb.image_id("node1", SSHD_TAG).removeprefix("sha256:") in image_ids


# --- registry login and pull ---------------------------------------------------------
#
# The sandbox registry serves plain HTTP; each podman host's registries.conf
# marks the bridge's gateway address insecure and its logins go to an auth
# file of its own (sandbox/podman.py): what cvs sends is unchanged.

PUSHER = "node3"  # pushes the image; the registry tests use node1 and node2
TWO = ["node1", "node2"]


@pytest.fixture(scope="module")
def podman_registry(podman_sandbox: Sandbox) -> Iterator[tuple[SandboxRegistry, str]]:
    """The registry, holding the sandbox's sshd image as REGISTRY/cvs/sshd:1,
    pushed by podman (the same image ID as the hosts' SSHD_TAG)."""
    sb = podman_sandbox
    with sb.registry() as reg:
        ref = reg.ref("cvs/sshd", "1")
        login = [*sb.runtime_argv(PUSHER), "login", "-u", reg.username, "--password-stdin"]
        subprocess.run(
            [*login, reg.address], input=reg.password, text=True, check=True, capture_output=True
        )
        podman(sb, PUSHER, "tag", SSHD_TAG, ref)
        podman(sb, PUSHER, "push", "-q", ref)
        podman(sb, PUSHER, "rmi", ref)
        podman(sb, PUSHER, "logout", reg.address)
        yield reg, ref


def auth_file(sb: Sandbox, host: str) -> Path:
    return Path(sb.host(host).podman_env["REGISTRY_AUTH_FILE"])


@pytest.fixture
def registry_lab(lab: Lab, podman_registry: tuple[SandboxRegistry, str]) -> Iterator[Lab]:
    """A lab whose hosts forget the pulled image and their registry logins after."""
    lab.tags.append(podman_registry[1])
    try:
        yield lab
    finally:
        for host in TWO:
            auth_file(lab.sb, host).write_text("{}\n")


def test_podman_cold_start_logs_in_and_pulls_on_hosts_lacking_the_image(
    registry_lab: Lab, podman_registry: tuple[SandboxRegistry, str]
) -> None:
    lab, (reg, ref) = registry_lab, podman_registry
    credentials = {"username": reg.username, "password_file": str(reg.password_file)}
    path = lab.cluster(
        lifetime="persistent", hosts=TWO, image=ref, registry=credentials, distribute="registry"
    )  # every host pulls (the spread: tests/test_spread_podman.py)

    up = cvs(path, "--json", "up")

    assert up.returncode == 0, explain(up)
    report = [json.loads(x) for x in up.stdout.splitlines() if '"exit_code"' in x][-1]
    for host in TWO:
        steps = report["hosts"][host]["steps"]
        assert steps["login"] == "ok" and steps["pull"] == "ok", steps
        doc = inspect(lab.sb, host, lab.name)
        assert doc is not None and doc["State"]["Running"], host
        # The login is podman's own, on that host (its auth file names the registry).
        assert reg.address in json.loads(auth_file(lab.sb, host).read_text())["auths"]
    assert lab.sb.image_id("node1", ref) == lab.sb.image_id("node1", SSHD_TAG)
    # The password went from its file to podman's stdin: never in output or records.
    assert reg.password not in up.stdout + up.stderr
    for record in (lab.directory / "state").rglob("*"):
        if record.is_file():
            assert reg.password not in record.read_text(errors="replace"), record


def test_podman_pull_always_replaces_a_stale_local_tag_before_the_cold_start(
    registry_lab: Lab, podman_registry: tuple[SandboxRegistry, str]
) -> None:
    lab, (reg, ref) = registry_lab, podman_registry
    # Both hosts already have the tag, pointing at images of their own.
    for host in TWO:
        lab.sb.import_skewed_image(host, ref)
    credentials = {"username": reg.username, "password_file": str(reg.password_file)}
    path = lab.cluster(
        lifetime="persistent",
        hosts=TWO,
        image=ref,
        registry=credentials,
        pull="always",
        distribute="registry",  # every host pulls
    )

    rc, report = cvs_json(path, "up")

    assert rc == 0, report
    wanted = lab.sb.image_id(PUSHER, SSHD_TAG)
    for host in TWO:
        assert report["hosts"][host]["steps"]["pull"] == "ok", report
        doc = inspect(lab.sb, host, lab.name)
        assert doc is not None and "sha256:" + doc["Image"].removeprefix("sha256:") == wanted


@contextlib.contextmanager
def stalling_registry(address: str) -> Iterator[str]:
    """host:port of an endpoint that takes connections and never answers
    (the kernel completes the handshake; nobody accepts)."""
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(16)
        yield f"{address}:{listener.getsockname()[1]}"


def processes_naming(text: str, settle: float = 5.0) -> list[str]:
    """Command lines on this machine (every sandbox host's processes are
    here) that mention `text`, once they had `settle` seconds to end."""
    deadline = time.monotonic() + settle
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                words = cmdline.read_bytes().decode(errors="replace").split("\0")
                if any(text in w for w in words):
                    found.append(" ".join(words))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.parametrize("step", ["login", "pull"])
def test_podman_login_or_pull_beyond_start_timeout_fails_that_host_and_starts_nothing(
    registry_lab: Lab, podman_registry: tuple[SandboxRegistry, str], step: str
) -> None:
    lab, (reg, _) = registry_lab, podman_registry
    with stalling_registry(reg.address.rsplit(":", 1)[0]) as stalled:
        ref = f"{stalled}/cvs/sshd:1"
        lab.tags.append(ref)
        podman(lab.sb, "node1", "tag", SSHD_TAG, ref)  # node1 has it; node2 must get it
        extra: dict[str, Any] = {}
        if step == "login":
            extra["registry"] = {
                "username": reg.username,
                "password_file": str(reg.password_file),
                "server": stalled,
            }
        path = lab.cluster(lifetime="persistent", hosts=TWO, image=ref, start_timeout=2, **extra)
        started = time.monotonic()
        up = cvs(path, "up")
        took = time.monotonic() - started
        # Still stalled: the host's podman was stopped, not left waiting on it.
        lingering = processes_naming(stalled)

    assert up.returncode == 1, explain(up)
    assert not lingering, lingering
    failed = [line for line in up.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and failed[0].startswith(f"node2: cold_start FAILED at {step}"), failed
    assert "did not finish within container.start_timeout (2s" in failed[0], explain(up)
    assert took < 60, took  # bounded by the timeout, not by podman giving up
    # Nothing half-started: no container on either host.
    assert ids(lab.sb, lab.name, TWO) == dict.fromkeys(TWO)


# --- shell and the pytest plugin ----------------------------------------------------------


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux")
    t = Tmux(f"cvs-test-pm-{os.getpid()}")
    try:
        yield t
    finally:
        t("kill-server")


def test_podman_shell_is_interactive_inside_the_hosts_container(lab: Lab, tmux: Tmux) -> None:
    path = lab.cluster(lifetime="persistent", hosts=["node1", "node2"])
    up = cvs(path, "up")
    assert up.returncode == 0, explain(up)
    podman(lab.sb, "node2", "exec", lab.name, "touch", "/tmp/in-node2-container")
    command = (
        f"PYTHONPATH={REPO} {sys.executable} -m orchestrator -c {path} shell node2; "
        "echo SHELL-EXIT-$?; sleep 60"
    )

    tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "40", command)
    tmux("send-keys", "-t", "t", "test -f /tmp/in-node2-container && echo MARK-$((40+2))", "Enter")
    tmux.wait_for("MARK-42", timeout=60)
    # podman's own mark inside its containers: this shell is in podman's container.
    tmux("send-keys", "-t", "t", "test -f /run/.containerenv && echo PODMAN-$((1+1))", "Enter")
    tmux.wait_for("PODMAN-2")
    tmux("send-keys", "-t", "t", "tty; exit 3", "Enter")
    screen = tmux.wait_for("SHELL-EXIT-3")

    assert "/dev/pts/" in screen  # a real terminal inside the container


PLUGIN_TESTS = """\
def test_every_container_is_podmans(cluster):
    results = cluster.exec("test -f /run/.containerenv && hostname")
    assert {h: (r.ok, r.stdout.strip()) for h, r in results.items()} == {
        h: (True, h) for h in cluster.hosts
    }
"""


def test_podman_cluster_through_the_pytest_plugin_is_up_for_the_tests_and_down_after(
    lab: Lab, tmp_path: Path
) -> None:
    path = lab.cluster(lifetime="per_run")
    (tmp_path / "test_on_podman.py").write_text(PLUGIN_TESTS)
    example = REPO / "orchestrator" / "examples" / "test_with_cluster.py"

    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--cvs-orchestrator-cluster", str(path), str(tmp_path / "test_on_podman.py"),
         str(example)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip

    assert proc.returncode == 0, explain(proc)
    assert "4 passed" in proc.stdout, explain(proc)
    # per_run: the plugin took its containers down after the last test.
    assert ids(lab.sb, lab.name) == dict.fromkeys(THREE)


# --- a mixed fleet, end to end ---------------------------------------------------------------


def test_a_fleet_of_a_docker_host_and_a_podman_host_is_refused_before_anything_starts(
    lab: Lab, make_sandbox: Any, tmp_path: Path
) -> None:
    """One host of a docker sandbox and one of the podman sandbox in one cluster
    (`container.runtime: docker`): refused up front naming the podman host and
    the fix, and the docker host, which could have started, is left untouched.

    (The other way round, `runtime: podman` with a docker host, cannot be built
    here: podman is installed machine-wide, so the docker host would answer
    `sudo -n podman` with the machine's own store. The probe's message for a
    host lacking podman is pinned in test_runtime.py.)"""
    docker_sb: Sandbox = make_sandbox(hosts=1)
    hosts = {"docker1": docker_sb.host("node1"), "podman1": lab.sb.host("node1")}
    known = tmp_path / "known_hosts"
    known.write_text(docker_sb.known_hosts.read_text() + lab.sb.known_hosts.read_text())
    doc = yaml.safe_load(lab.sb.cluster_file.read_text())
    doc["name"] = lab.name
    doc["hosts"] = [{"name": n, "address": h.address, "port": h.port} for n, h in hosts.items()]
    doc["ssh"].update(
        identity_files=[str(docker_sb.key_file), str(lab.sb.key_file)], known_hosts=str(known)
    )
    doc["state_dir"] = str(tmp_path / "state")
    doc["container"] = {
        **doc["container"],
        "name": lab.name,
        "lifetime": "per_run",
        "runtime": "docker",
        "sshd": {"enabled": False},
    }
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))

    up = cvs(path, "up")

    assert up.returncode == 4, explain(up)
    assert "podman1" in up.stderr and "this host has podman" in up.stderr, explain(up)
    assert "container.runtime: podman" in up.stderr, explain(up)
    assert "docker1" not in up.stderr, explain(up)  # the docker host was fine
    docker_inspect = subprocess.run(
        [*docker_sb.docker_argv("node1"), "container", "inspect", lab.name],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert docker_inspect.returncode != 0 and "No such container" in docker_inspect.stderr
    assert inspect(lab.sb, "node1", lab.name) is None


# --- MPI between podman containers ----------------------------------------------------------
#
# Real Open MPI jobs run in tests/test_mpi.py (the `--mpi` sandbox image). This
# step, on the plain sshd image (no `mpirun`, so not an `mpi: true` step: that
# is refused naming the image), does by hand what mpirun needs from cvs: read
# the hostfile, reach every peer's container over the in-container sshd (the
# configured port, strict host keys), and from each peer reach back: every
# container's client side and every sshd.

MPI_HOP = r"""
set -eu
head=$(hostname)
n=0
while read -r peer slots; do
  echo "rank-host $(ssh -n "$peer" "echo \$(hostname) \$(ssh -n $head hostname)") $slots"
  n=$((n+1))
done < "$CVS_MPI_HOSTFILE"
echo "np=$CVS_MPI_NP hosts=$CVS_MPI_HOSTS reached=$n"
"""


# What an mpi step's command would see (suites.runner.mpi_env), on the head only.
HOP = {
    "hosts": "head",
    "env": {
        "CVS_MPI_HOSTFILE": "/etc/cvs/hostfile",
        "CVS_MPI_NP": "3",
        "CVS_MPI_HOSTS": "node1,node2,node3",
    },
}


def sshd_pids(sb: Sandbox, name: str) -> dict[str, str]:
    return {h: podman(sb, h, "exec", name, "cat", "/run/cvs-sshd.pid") for h in THREE}


def test_podman_mpi_step_reaches_every_peer_from_the_hostfile_and_sshd_is_kept(
    lab: Lab, tmp_path: Path
) -> None:
    path = lab.cluster(lifetime="persistent", sshd_port=2463)
    suite = tmp_path / "mpi_hop.yaml"
    suite.write_text(
        yaml.safe_dump({"name": "mpi_hop", "steps": [{"name": "hop", "run": MPI_HOP, **HOP}]})
    )
    try:
        up = cvs(path, "up")
        assert up.returncode == 0, explain(up)
        pids = sshd_pids(lab.sb, lab.name)
        # The sshd listens on the configured port, nowhere else.
        conf = podman(lab.sb, "node2", "exec", lab.name, "cat", "/etc/ssh/cvs_sshd_config")
        assert "Port 2463" in conf.splitlines()

        run = cvs(path, "run", str(suite), "--run-dir", str(tmp_path / "run"))
        again = cvs(path, "up")

        assert run.returncode == 0, explain(run)
        doc = json.loads((tmp_path / "run" / "results.json").read_text())
        hosts = doc["steps"][0]["hosts"]
        assert list(hosts) == ["node1"]  # once, on the head container
        tail = hosts["node1"]["tail"].splitlines()
        # Every peer in the hostfile, in order, answered by name, and reached back.
        assert [ln for ln in tail if ln.startswith("rank-host")] == [
            f"rank-host {h} node1 slots=1" for h in THREE
        ], tail
        assert "np=3 hosts=node1,node2,node3 reached=3" in tail, tail
        # A second `up` attaches and leaves each running sshd alone.
        assert again.returncode == 0, explain(again)
        assert sshd_pids(lab.sb, lab.name) == pids
    finally:
        cvs(path, "down", "--force")


# --- locks -------------------------------------------------------------------------------------
#
# The lock lives on the host, outside the runtime (containers/locks.py): the
# same directory and holder lines on podman hosts as on docker hosts.


def lock_dirs(name: str) -> list[Path]:
    return sorted(Path("/tmp").glob(f"cvs-{name}-*.lock"))


def start_cvs(path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CVS, "-c", str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "CI": "1"},
    )


def test_podman_two_concurrent_ups_take_turns_one_cold_start_one_attach(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    try:
        first, second = (start_cvs(path, "--json", "up") for _ in range(2))
        outs = [p.communicate(timeout=300) for p in (first, second)]

        reports = [json.loads(out.splitlines()[-1]) for out, _ in outs]
        assert [p.returncode for p in (first, second)] == [0, 0], outs
        actions = sorted(tuple(sorted({v["action"] for v in r["hosts"].values()})) for r in reports)
        # One started the containers; the other waited, then found them running.
        assert actions == [("attach",), ("cold_start",)], reports
        # The one that attached waited for the other's cold start, and said so
        # (--json: cvs's messages are events on stdout). Both may have waited:
        # contended, each takes the locks again in order, head host first.
        attached = next(
            out + err
            for (out, err), r in zip(outs, reports, strict=True)
            if {v["action"] for v in r["hosts"].values()} == {"attach"}
        )
        waited = rf"waiting for the lock on container {lab.name} held by .*\bup\b"
        assert re.search(waited, attached), attached
        assert len({i for i in ids(lab.sb, lab.name, TWO).values()}) == 2  # one per host
        assert lock_dirs(lab.name) == []
    finally:
        cvs(path, "down", "--force")


def test_podman_down_waits_for_an_exec_and_no_wait_is_refused_naming_it(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    assert cvs(path, "up").returncode == 0
    stamp = "date +%s.%N; sleep 8; date +%s.%N"
    running = start_cvs(path, "exec", "--", stamp)
    wait_for_holders(lab.name, TWO)

    waiting = start_cvs(path, "down", "--force")
    refused = cvs(path, "down", "--force", "--no-wait")
    out, err = running.communicate(timeout=300)
    down_out, down_err = waiting.communicate(timeout=300)

    assert running.returncode == 0, out + err  # nothing removed its container under it
    assert out.count("node") >= 4, out
    assert refused.returncode == 4, explain(refused)
    assert "held" in refused.stderr and "exec" in refused.stderr, refused.stderr
    assert waiting.returncode == 0, down_out + down_err
    said = down_out + down_err
    assert "waiting for the lock" in said and "exec" in said, said
    assert ids(lab.sb, lab.name, TWO) == dict.fromkeys(TWO)
    assert lock_dirs(lab.name) == []


# --- a hung podman: messages name podman -----------------------------------------------------
#
# Podman has no daemon to SIGSTOP. What hangs a podman host is a podman call
# stuck behind another holding the host's state: here the test holds the
# exclusive flock(2) that podman 4.3 takes on its state database
# (GRAPHROOT/libpod/bolt_state.db, bbolt's own lock) for every call, as a
# stuck `podman` process would.

HUNG_BOUND = "podman did not answer within container.runtime_timeout (5s)"


@contextlib.contextmanager
def held_podman_state(sb: Sandbox, host: str) -> Iterator[None]:
    graph_root = podman(sb, host, "info", "--format", "{{.Store.GraphRoot}}")
    with open(Path(graph_root) / "libpod" / "bolt_state.db", "rb") as db:
        fcntl.flock(db, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(db, fcntl.LOCK_UN)


def test_a_hung_podman_bounds_status_exec_and_up_and_names_podman_not_docker(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO, runtime_timeout=5)
    assert cvs(path, "up").returncode == 0
    limit = 5 + 25  # the bound is 5 s; generous against this shared 2-core machine
    with held_podman_state(lab.sb, "node2"):
        started = time.monotonic()
        status = cvs(path, "status")
        t_status = time.monotonic() - started
        started = time.monotonic()
        execd = cvs(path, "--json", "exec", "--", "hostname")
        t_exec = time.monotonic() - started
        up = cvs(path, "up")

    assert status.returncode == 1 and t_status < limit, explain(status)
    assert "node2" in status.stderr and HUNG_BOUND in status.stderr, explain(status)
    assert execd.returncode == 1 and t_exec < limit, explain(execd)
    hosts = last_json(execd)["hosts"]
    assert hosts["node1"]["ok"] and HUNG_BOUND in hosts["node2"]["error"], hosts
    assert up.returncode == 4 and HUNG_BOUND in up.stderr, explain(up)
    said = status.stderr + execd.stdout + execd.stderr + up.stderr
    assert "podman has no daemon" in said
    assert "dockerd" not in said and "docker did not answer" not in said, said
    # Once podman answers again, so does the cluster, and no lock stayed behind.
    assert cvs(path, "exec", "--", "true").returncode == 0
    assert lock_dirs(lab.name) == []


# --- `cvs sandbox up --runtime podman --rootless` ------------------------------------------


def test_cvs_sandbox_up_runtime_podman_rootless_builds_a_cluster_cvs_drives(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "sb"
    try:
        built = cli(
            "sandbox", "up", "--runtime", "podman", "--rootless", "--hosts", "1",
            "--dir", str(directory), timeout=600,
        )  # fmt: skip
        assert built.returncode == 0, explain(built)
        cluster = Path(built.stdout.strip().splitlines()[-1])
        doc = yaml.safe_load(cluster.read_text())
        assert doc["ssh"]["user"] == DOCKER_USER  # no sudo: the user's own podman
        assert (doc["container"]["runtime"], doc["container"]["rootless"]) == ("podman", True)
        doc["container"]["sshd"] = {"enabled": False}
        doc["state_dir"] = str(tmp_path / "state")
        cluster.write_text(yaml.safe_dump(doc, sort_keys=False))

        rc, report = cvs_json(cluster, "up")
        inside = cvs(cluster, "exec", "--", "test -f /run/.containerenv && cat /proc/self/uid_map")

        assert rc == 0 and report["hosts"]["node1"]["action"] == "cold_start", report
        assert inside.returncode == 0, explain(inside)
        # Root inside is the login user outside: a rootless container.
        mapped = inside.stdout.split(" | ", 1)[1].split()
        assert mapped[:2] == ["0", str(pwd.getpwnam(DOCKER_USER).pw_uid)], inside.stdout
    finally:
        cli("sandbox", "down", "--dir", str(directory), timeout=300)
    assert not directory.exists() or not (directory / "sandbox.json").exists()


# --- rootless GPUs: `--group-add keep-groups` is crun's, this machine runs runc --------------


def rootless_inspect(sb: Sandbox, name: str, template: str) -> str:
    proc = subprocess.run(
        [*sb.ssh_argv("node1", DOCKER_USER), f"podman inspect --format '{template}' {name}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_rootless_gpus_on_runc_get_no_keep_groups_and_up_says_what_access_relies_on(
    lab: Lab, rootless_images: str, device_root: Path
) -> None:
    path = rootless_cluster(
        lab,
        gpus={"count": 1},
        cdi="never",
        host_extra={"node1": {"gpu_device_root": str(device_root)}},
    )
    try:
        validate = cvs(path, "validate")
        up = cvs(path, "up")
        inside = cvs(
            path,
            "exec",
            "--",
            "grep '^Groups:' /proc/self/status; : < /dev/dri/renderD128 && echo OPENED",
        )

        assert "`--group-add keep-groups`" in validate.stderr, explain(validate)
        assert up.returncode == 0, explain(up)
        said = " ".join(up.stderr.split())
        assert "host node1: rootless podman: its OCI runtime is runc, which ignores" in said, said
        assert "not sent" in said and "mode 0666" in said
        create = json.loads(rootless_inspect(lab.sb, lab.name, "{{json .Config.CreateCommand}}"))
        assert "keep-groups" not in create and "/dev/dri/renderD128" in " ".join(create)
        lines = [ln.split(" | ", 1)[1] for ln in inside.stdout.splitlines() if " | " in ln]
        # No supplementary group in the container; the 0666 stand-in opens anyway.
        assert lines[0].split() == ["Groups:"] and "OPENED" in lines, inside.stdout
    finally:
        cvs(path, "down", "--force")


# --- CVS's way in, on podman -------------------------------------------------------------------
#
# The CVS stand-in (tests/cvs_standin: CVS's import paths, suites written as
# CVS's are) through `cvs run TEST --cluster_file --config_file`, with a CVS
# cluster JSON whose `runtime.name` is podman: install in one process, the
# checks (exec shapes, host handles, the stand-in mpirun over the provisioned
# hostfile) in a second one, in the same persistent containers.

STANDIN = REPO / "tests" / "cvs_standin"


def cvs_compat(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CVS_CLUSTER", "CVS_ENGINE")}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{STANDIN}"
    return cli(*args, cwd=cwd, base_env=env, timeout=400)


def test_cvs_install_then_checks_in_a_new_process_on_podmans_persistent_containers(
    lab: Lab, tmp_path: Path
) -> None:
    sb = lab.sb
    nodes = [sb.host(h).address for h in THREE]
    cluster = tmp_path / "cluster.json"
    cluster.write_text(
        json.dumps(
            {
                "orchestrator": "container",
                "username": yaml.safe_load(sb.cluster_file.read_text())["ssh"]["user"],
                "priv_key_file": str(sb.key_file),
                "node_dict": {n: {"bmc_ip": "NA", "vpc_ip": n} for n in nodes},
                "name": f"compat-{lab.name}",
                "state_dir": str(tmp_path / "state"),
                "ssh": {"known_hosts": str(sb.known_hosts), "use_ssh_config": False},
                "container": {
                    "image": SSHD_TAG,
                    "name": lab.name,
                    "enabled": True,
                    "launch": True,
                    "sshd": {"port": 2464},
                    # CVS's runtime block naming podman; over CVS's defaults,
                    # what this machine refuses (--privileged, memlock above 8 MiB).
                    # With any --ulimit, podman raises nofile and nproc to their
                    # maximum unless they are given too, which this machine
                    # refuses as well (no CAP_SYS_RESOURCE): given, within its limits.
                    "runtime": {
                        "name": "podman",
                        "args": {
                            "privileged": False,
                            "ulimit": ["memlock=8388608", "nofile=16384", "nproc=8192"],
                        },
                    },
                },
            }
        )
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"compat": {"token": uuid.uuid4().hex}}))
    files = ["--cluster_file", str(cluster), "--config_file", str(config)]
    try:
        install = cvs_compat(
            "run", "compat_install", *files, "--run-dir", str(tmp_path / "i"), cwd=tmp_path
        )
        after = ids(sb, lab.name)
        checks = cvs_compat(
            "run", "compat_checks", *files, "--run-dir", str(tmp_path / "c"), cwd=tmp_path
        )

        assert install.returncode == 0 and "2 passed" in install.stdout, explain(install)
        assert checks.returncode == 0 and "12 passed" in checks.stdout, explain(checks)
        plans = [
            json.loads((tmp_path / d / "results.json").read_text())["plan"] for d in ("i", "c")
        ]
        assert [{e["action"] for e in p.values()} for p in plans] == [{"cold_start"}, {"attach"}]
        # podman's containers (the rootful store on each host), the same ones both times.
        assert all(after.values()) and ids(sb, lab.name) == after
    finally:
        cvs_compat("down", "-c", str(cluster), "--force", cwd=tmp_path)
    assert ids(sb, lab.name) == dict.fromkeys(THREE)


# --- why a command died: the diagnosis asks podman ----------------------------------------


def test_a_podman_container_stopped_under_exec_is_named_from_podmans_own_facts(lab: Lab) -> None:
    path = lab.cluster(lifetime="persistent", hosts=TWO)
    assert cvs(path, "up").returncode == 0
    # node1's sleep is the wait for the whole invocation; node2's is stopped
    # 1.5 s after it is seen (at load 15-20), far within its 15 s.
    running = start_cvs(path, "--json", "exec", "--", "echo begun; sleep 15")
    try:
        deadline = time.monotonic() + 120
        # The command runs in node2's container once its sleep is there.
        # `1[5]`: the pattern must not match the grep (or its shell) that looks.
        probe = ["exec", lab.name, "sh", "-c", "grep -l 'sleep 1[5]' /proc/[0-9]*/cmdline"]
        while podman(lab.sb, "node2", *probe, check=False) == "":
            assert time.monotonic() < deadline, "the command never started on node2"
            time.sleep(0.5)
        seen = time.monotonic()
        time.sleep(1)
        podman(lab.sb, "node2", "stop", "-t", "1", lab.name)
        print(f"node2's container stopped {time.monotonic() - seen:.1f}s after its sleep was seen")
        out, err = running.communicate(timeout=180)
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()

    hosts = last_json(out)["hosts"]
    assert running.returncode == 1 and hosts["node1"]["ok"], out + err
    error = hosts["node2"]["error"]
    # podman's facts: its status word, its times read (so "while the command ran").
    # Podman says "stopped" until its cleanup process has run, "exited" after:
    # which one depends on when the diagnosis asks.
    said = re.search(r"the container stopped while the command ran \(now (exited|stopped)", error)
    assert said, error
    assert "docker" not in error, error
