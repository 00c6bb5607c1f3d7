"""Setup scripts are read (and hashed) when the cluster file loads, not mid-`up`."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from clitools import cvs_in_process

from orchestrator.config import ConfigError, load_cluster
from orchestrator.config import loader as config_loader
from orchestrator.containers.provision import SetupScript


def cluster_file(tmp_path: Path, script: str | None) -> Path:
    # 192.0.2.1 (TEST-NET-1) never answers: contacting it would hang, not fail fast.
    line = f", setup_script: {script}" if script is not None else ""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "hosts: [{name: h1, address: 192.0.2.1}]\n"
        "ssh: {connect_timeout: 30, connect_retries: 0}\n"
        f"container: {{image: img, lifetime: persistent, name: c{line}}}\n"
    )
    return path


def test_missing_setup_script_is_exit_2_before_any_host_is_contacted(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, "gone.sh")
    started = time.monotonic()
    proc = cvs_in_process("up", "-c", str(path), ci=False)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - started < 20  # no connection attempt (it would take 30 s)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "container.setup_script" in lines[0] and "gone.sh" in lines[0]
    assert "Traceback" not in proc.stderr


def test_script_removed_after_load_is_the_one_read_at_load(tmp_path: Path) -> None:
    script = tmp_path / "setup.sh"
    script.write_bytes(b"echo from-load\n")
    cluster = load_cluster(cluster_file(tmp_path, "setup.sh"))
    script.unlink()
    assert cluster.container is not None
    loaded = SetupScript.for_config(cluster.container)
    assert loaded.content == b"echo from-load\n"
    assert loaded.sha256 == hashlib.sha256(b"echo from-load\n").hexdigest()
    assert not loaded.is_default


def test_packaged_default_is_read_at_load(tmp_path: Path) -> None:
    cluster = load_cluster(cluster_file(tmp_path, None))
    assert cluster.container is not None
    script = SetupScript.for_config(cluster.container)
    assert script.is_default and b"openssh-server" in script.content


def test_missing_packaged_default_is_one_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a broken install looks like: the package lacks its default script.
    monkeypatch.setattr(config_loader, "DEFAULT_SETUP_SCRIPT", "not-shipped.sh")
    with pytest.raises(ConfigError, match="packaged default setup script cannot be read") as exc:
        load_cluster(cluster_file(tmp_path, None))
    assert "\n" not in str(exc.value)
