"""`cvs sandbox up` flags that cannot go together: one line, exit 2, nothing built.

(The podman sandbox itself, built by `cvs sandbox up --runtime podman
--rootless`, is driven end to end in tests/test_podman.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import cvs_in_process, explain


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--rootless"], "--rootless is rootless podman; add --runtime podman"),
        (["--rootless", "--runtime", "docker"], "add --runtime podman"),
        (["--runtime", "podman", "--egress"], "the --egress host runs docker only"),
        (["--lifetime", "per_job"], "--lifetime per_job keeps containers until their Slurm"),
        (
            ["--runtime", "podman", "--rootless", "--registry"],
            "--registry is built for rootful hosts only; leave out --rootless",
        ),
    ],
)
def test_sandbox_flags_that_do_not_go_together_are_refused_before_anything_is_built(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    directory = tmp_path / "sb"

    proc = cvs_in_process("sandbox", "up", "--hosts", "1", "--dir", str(directory), *flags)

    assert proc.returncode == 2, explain(proc)
    assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, explain(proc)
    assert not directory.exists()


def test_sandbox_runtime_names_only_the_runtimes_there_are(tmp_path: Path) -> None:
    proc = cvs_in_process("sandbox", "up", "--runtime", "enroot", "--dir", str(tmp_path / "sb"))

    assert proc.returncode == 2, explain(proc)
    assert "invalid choice: 'enroot'" in proc.stderr and "docker" in proc.stderr


def test_a_podman_sandbox_checks_for_podman_and_a_rootless_one_for_uidmap(tmp_path: Path) -> None:
    from orchestrator.sandbox import prereqs

    empty = tmp_path / "bin"
    empty.mkdir()
    needs = {**prereqs.PODMAN_COMMANDS, **prereqs.ROOTLESS_COMMANDS}

    docker = prereqs.check(tmp_path / "sb", [], path_env=str(empty), is_root=lambda: True)
    rootless = prereqs.check(
        tmp_path / "sb", [], path_env=str(empty), is_root=lambda: True, commands=needs
    )

    assert "podman" not in docker.missing
    found = {**rootless.missing, **dict.fromkeys(rootless.off_path, "")}
    assert {"podman", "newuidmap", "newgidmap"} <= set(found)
    if "newuidmap" in rootless.missing:
        assert "uidmap" in rootless.install_command()
