"""The image spread with rootful podman hosts (containers/spread.py): the
archive is a docker-archive, whose load keeps the image ID.

A sandbox of its own whose three nodes run podman (as tests/test_podman.py
builds it); the image is the sandbox's sshd image under a tag no host has.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from clitools import cvs_on, explain, last_json
from labtools import docker as podman

from orchestrator.sandbox import SSHD_TAG, Sandbox, sandbox_down, sandbox_up

pytestmark = pytest.mark.sandbox

THREE = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def podman_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if os.geteuid() != 0:
        pytest.skip("sandbox tests need root")
    if shutil.which("podman") is None:
        pytest.skip("podman hosts need podman (apt-get install podman uidmap)")
    directory = tmp_path_factory.mktemp("podman-spread") / "sb"
    try:
        yield sandbox_up(directory, hosts=3, runtime="podman")
    finally:
        sandbox_down(directory)


@pytest.mark.parametrize("transport", ["relay", "direct"])
def test_podman_spread_keeps_the_image_id_on_every_host(
    podman_sandbox: Sandbox, tmp_path: Path, transport: str
) -> None:
    sb = podman_sandbox
    name = f"cvs-sp-{uuid.uuid4().hex[:8]}"
    tag = f"localhost/cvs-spread/{name}:1"
    directory = Path(tempfile.mkdtemp(prefix="cvs-spread-pm-"))
    directory.chmod(0o755)
    tar = directory / "image.tar"
    try:
        podman(sb, "node3", "tag", SSHD_TAG, tag)
        podman(sb, "node3", "save", "--format", "docker-archive", "-o", str(tar), tag)
        image_id = podman(sb, "node3", "image", "inspect", "-f", "{{.Id}}", tag).strip()
        podman(sb, "node3", "rmi", tag)
        tar.chmod(0o644)
        doc = yaml.safe_load(sb.cluster_file.read_text())
        doc["name"] = name
        doc["state_dir"] = str(tmp_path / "state")
        doc["container"] = {
            **doc["container"],
            "name": name,
            "lifetime": "per_run",
            "image": tag,
            "image_tar": str(tar),
            "sshd": {"enabled": False},
            "spread_transport": transport,
        }
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        plan = cvs_on(path, "plan", timeout=240)
        assert "node1 -> node2, node3" in plan.stdout, explain(plan)
        up = cvs_on(path, "--json", "up", timeout=240)
        assert up.returncode == 0, explain(up)
        assert "not reached host to host" not in up.stdout, explain(up)
        assert "image not received" not in up.stdout, explain(up)  # no second round
        hosts = last_json(up)["hosts"]
        assert hosts["node1"]["steps"]["load"] == "ok", hosts["node1"]
        events = [json.loads(x) for x in up.stdout.splitlines() if x.startswith("{")]
        progress = {e["host"] for e in events if e.get("event") == "ImageProgress"}
        assert progress == set(THREE[1:]), progress  # direct: each receiver's own count
        for host in THREE[1:]:
            assert hosts[host]["steps"].get("spread") == "ok", hosts[host]
        ids = {
            h: podman(sb, h, "image", "inspect", "-f", "{{.Id}}", tag, check=False).strip()
            for h in THREE
        }
        assert set(ids.values()) == {image_id}, json.dumps(ids)
    finally:
        for host in THREE:
            podman(sb, host, "rm", "-f", "-t", "0", name, check=False)
            podman(sb, host, "rmi", "-f", tag, check=False)
        shutil.rmtree(directory, ignore_errors=True)
