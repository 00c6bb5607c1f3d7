"""The pull path for real: a registry in the sandbox (Debian's docker-registry,
htpasswd auth), cold starts that log in and pull, `pull: never`, `image_tar`,
`start_timeout` reaching the pull, and the image-ID check after a pull."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import Lab, cvs, docker, explain, inspect

from orchestrator.containers.argv import image_registry
from orchestrator.sandbox import SSHD_TAG, Sandbox
from orchestrator.sandbox.registry import SandboxRegistry

TWO = ["node1", "node2"]
PUSHER = "node4"  # pushes the image; the tests use node1..node3


@pytest.fixture(scope="module")
def registry(sandbox: Sandbox) -> Iterator[tuple[SandboxRegistry, str]]:
    """The registry, holding the sandbox's sshd image as REGISTRY/cvs/sshd:1."""
    with sandbox.registry() as reg:
        ref = reg.ref("cvs/sshd", "1")
        login = [*sandbox.docker_argv(PUSHER), "login", "-u", reg.username, "--password-stdin"]
        subprocess.run(
            [*login, reg.address], input=reg.password, text=True, check=True, capture_output=True
        )
        docker(sandbox, PUSHER, "tag", SSHD_TAG, ref)
        docker(sandbox, PUSHER, "push", "-q", ref)
        docker(sandbox, PUSHER, "rmi", ref)
        docker(sandbox, PUSHER, "logout", reg.address)
        yield reg, ref


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path, registry: tuple[SandboxRegistry, str]) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.tags.append(registry[1])  # every host forgets the pulled image afterwards
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    docs = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert docs, explain(proc)
    return docs[-1]


def test_cold_start_logs_in_and_pulls_on_hosts_lacking_the_image(
    lab: Lab, registry: tuple[SandboxRegistry, str]
) -> None:
    reg, ref = registry
    credentials = {"username": reg.username, "password_file": str(reg.password_file)}
    path = lab.cluster(
        lifetime="persistent", hosts=TWO, image=ref, registry=credentials, distribute="registry"
    )  # every host pulls (the spread: tests/test_spread_sandbox.py)
    up = cvs(path, "--json", "up")
    assert up.returncode == 0, explain(up)
    hosts = report(up)["hosts"]
    for host in TWO:
        steps = hosts[host]["steps"]  # type: ignore[index]
        assert steps["login"] == "ok" and steps["pull"] == "ok", steps
        assert inspect(lab.sandbox, host, lab.name)["State"]["Running"]  # type: ignore[index]
    # The password went from its file to docker's stdin: never in argv or output.
    assert reg.password not in up.stdout + up.stderr


def test_pull_never_on_a_host_without_the_image_refuses_naming_it(
    lab: Lab, registry: tuple[SandboxRegistry, str]
) -> None:
    _, ref = registry
    lab.tag("node1", SSHD_TAG, ref)  # node1 has it, node2 does not
    path = lab.cluster(lifetime="persistent", hosts=TWO, image=ref, pull="never")
    up = cvs(path, "up")
    assert up.returncode == 4, explain(up)
    assert "not found on node2 and container.pull is 'never'" in up.stderr
    assert all(inspect(lab.sandbox, h, lab.name) is None for h in TWO)


@pytest.fixture
def image_tar(sandbox: Sandbox) -> Iterator[tuple[str, Path]]:
    """A `docker save` tar of a tag no host has, where the login user reads it."""
    tag = "cvs-tar/sshd:1"
    directory = Path(tempfile.mkdtemp(prefix="cvs-image-tar-"))
    directory.chmod(0o755)
    tar = directory / "image.tar"
    docker(sandbox, PUSHER, "tag", SSHD_TAG, tag)
    try:
        docker(sandbox, PUSHER, "save", "-o", str(tar), tag)
        tar.chmod(0o644)
        yield tag, tar
    finally:
        docker(sandbox, PUSHER, "rmi", tag, check=False)
        shutil.rmtree(directory, ignore_errors=True)


def test_image_tar_is_loaded_on_hosts_lacking_it(lab: Lab, image_tar: tuple[str, Path]) -> None:
    tag, tar = image_tar
    lab.tags.append(tag)
    path = lab.cluster(
        lifetime="persistent", hosts=TWO, image=tag, image_tar=str(tar), distribute="registry"
    )  # every host loads it
    up = cvs(path, "--json", "up")
    assert up.returncode == 0, explain(up)
    for host, entry in report(up)["hosts"].items():  # type: ignore[union-attr]
        assert entry["steps"]["load"] == "ok", (host, entry)
        assert inspect(lab.sandbox, host, lab.name) is not None


@contextlib.contextmanager
def stalling_registry(address: str) -> Iterator[str]:
    """host:port of a registry endpoint that takes connections and never answers.

    Listening without accepting is enough: the kernel completes the handshake,
    the client sends its request and waits. A real pull of the small sandbox
    image can finish within any short timeout on an idle machine; this cannot.
    """
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(16)
        yield f"{address}:{listener.getsockname()[1]}"


def test_pull_beyond_start_timeout_fails_that_host_and_starts_nothing(
    lab: Lab, registry: tuple[SandboxRegistry, str]
) -> None:
    reg, _ = registry
    with stalling_registry(reg.address.rsplit(":", 1)[0]) as stalled:
        ref = f"{stalled}/cvs/sshd:1"
        lab.tag("node1", SSHD_TAG, ref)  # node1 has it; node2 must pull, and the pull hangs
        path = lab.cluster(lifetime="persistent", hosts=TWO, image=ref, start_timeout=2)
        up = cvs(path, "up")
    assert up.returncode == 1, explain(up)
    assert "node2" in up.stderr and "container.start_timeout (2s)" in up.stderr, explain(up)
    # Nothing half-started: no container on either host.
    assert all(inspect(lab.sandbox, h, lab.name) is None for h in TWO)


def test_image_id_check_after_a_pull_still_refuses_skew(
    lab: Lab, registry: tuple[SandboxRegistry, str]
) -> None:
    reg, ref = registry
    lab.sandbox.import_skewed_image("node1", ref)  # same tag, another image ID
    credentials = {"username": reg.username, "password_file": str(reg.password_file)}
    path = lab.cluster(lifetime="persistent", hosts=TWO, image=ref, registry=credentials)
    up = cvs(path, "up")
    assert up.returncode == 4, explain(up)
    assert "node1" in up.stderr and "node2" in up.stderr
    assert all(inspect(lab.sandbox, h, lab.name) is None for h in TWO)


@pytest.mark.parametrize(
    ("image", "server"),
    [
        ("reg.example:5000/team/img:1", "reg.example:5000"),
        ("10.201.3.254:5000/cvs/sshd:1", "10.201.3.254:5000"),
        ("localhost/img", "localhost"),
        ("ghcr.io/org/img@sha256:" + "a" * 64, "ghcr.io"),
        ("rocm/cvs:7.0", None),
        ("ubuntu", None),
    ],
)
def test_login_goes_to_the_registry_the_image_names(image: str, server: str | None) -> None:
    assert image_registry(image) == server
