"""What the image-spread sandbox tests share (tests/test_spread_sandbox.py,
tests/test_spread_direct.py): host lists, the lab fixture, an image tar no
host has, and readers of image IDs and `--json` results."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from labtools import Lab, docker, explain

from orchestrator.sandbox import SSHD_TAG, Sandbox

FOUR = ["node1", "node2", "node3", "node4"]
THREE = FOUR[:3]


@pytest.fixture
def lab(sandbox: Sandbox, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(sandbox, tmp_path)
    lab.clean()
    try:
        yield lab
    finally:
        lab.clean()


@pytest.fixture
def image_tar(sandbox: Sandbox, lab: Lab) -> Iterator[tuple[str, Path, str]]:
    """(tag no host has, a `docker save` tar of it every host reads, its image ID)."""
    tag = f"cvs-spread/{lab.name}:1"
    directory = Path(tempfile.mkdtemp(prefix="cvs-spread-"))
    directory.chmod(0o755)
    tar = directory / "image.tar"
    docker(sandbox, "node4", "tag", SSHD_TAG, tag)
    try:
        docker(sandbox, "node4", "save", "-o", str(tar), tag)
        image_id = docker(sandbox, "node4", "image", "inspect", "-f", "{{.Id}}", tag).strip()
    finally:
        docker(sandbox, "node4", "rmi", tag, check=False)
    tar.chmod(0o644)
    lab.tags.append(tag)
    try:
        yield tag, tar, image_id
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def image_ids(lab: Lab, hosts: list[str], tag: str) -> dict[str, str]:
    return {
        h: docker(lab.sandbox, h, "image", "inspect", "-f", "{{.Id}}", tag, check=False).strip()
        for h in hosts
    }


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    docs = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert docs, explain(proc)
    return docs[-1]
