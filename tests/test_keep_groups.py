"""Rootless podman and device access: `--group-add keep-groups` only where the
host's podman runs crun (limits/rootless.py), decided from the OCI runtime the
probe read; elsewhere the plan says what device access relies on.

Measured here (podman 4.3.1, runc 1.1.5, rootless): podman passes
`--group-add keep-groups` to runc, which ignores it: the container's
`Groups:` is empty with and without it. tests/test_podman.py shows the same
on the sandbox through `cvs up`.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest

from orchestrator.config import ContainerConfig
from orchestrator.config.rootless import rootless_notes
from orchestrator.containers.argv import run_argv
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.probe import HostState, parse_probe_output, probe_argv
from orchestrator.limits.rootless import device_group_access
from orchestrator.remote.runtime import ContainerRuntime

IMG = "a" * 64
ROOTLESS = ContainerRuntime.unprobed("podman", rootless=True)


@pytest.mark.parametrize(
    ("rootless", "devices", "oci", "keep", "says"),
    [
        (True, True, "crun", True, None),
        (True, True, "runc", False, "its OCI runtime is runc, which ignores"),
        (True, True, None, False, "its OCI runtime is unknown"),
        (True, False, "runc", False, None),  # no devices: nothing to say
        (False, True, "runc", False, None),  # rootful: the runtime holds the groups
        (False, True, "crun", False, None),
    ],
)
def test_keep_groups_goes_only_to_crun_and_runc_hosts_are_told_why(
    rootless: bool, devices: bool, oci: str | None, keep: bool, says: str | None
) -> None:
    got = device_group_access("n1", rootless=rootless, wants_devices=devices, oci_runtime=oci)

    assert got.keep_groups is keep
    if says is None:
        assert got.note is None
    else:
        assert got.note is not None and says in got.note and "host n1" in got.note
        assert "not sent" in got.note and "mode 0666" in got.note


def test_on_crun_keep_groups_replaces_group_add_and_says_so() -> None:
    got = device_group_access(
        "n1", rootless=True, wants_devices=True, oci_runtime="crun", group_add=("video",)
    )

    assert got.keep_groups
    assert got.note is not None and "container.group_add (video) is not sent" in got.note


def test_the_run_argv_carries_keep_groups_instead_of_the_named_groups() -> None:
    cfg = ContainerConfig(
        image="img:1", runtime="podman", rootless=True, group_add=["video", "render"]
    )

    kept = run_argv(["podman"], cfg, "c", {}, keep_groups=True)
    plain = run_argv(["podman"], cfg, "c", {})

    pairs = list(itertools.pairwise(kept))
    assert ("--group-add", "keep-groups") in pairs
    assert ("--group-add", "video") not in pairs
    assert "keep-groups" not in plain
    assert ("--group-add", "render") in list(itertools.pairwise(plain))


def test_the_probe_asks_for_the_oci_runtime_only_for_rootless_podman() -> None:
    cfg = ContainerConfig(image="img:1", runtime="podman", rootless=True)
    asked = probe_argv(cfg, "c", sshd_port=2224, marker_path="/m", runtime=ROOTLESS, oci="stopped")
    rootful = probe_argv(
        cfg,
        "c",
        sshd_port=2224,
        marker_path="/m",
        runtime=ContainerRuntime.unprobed("podman"),
        oci="stopped",
    )

    assert asked[-2:] == ["--podman-rootless", "stopped"]
    assert rootful[-1] == "--podman"


PODMAN_STAND_IN = f"""
case "$1 $2" in
  "container inspect") echo "Error: inspecting object: no such container $5" >&2; exit 125 ;;
  "image inspect") echo 'J {{"Id": "{IMG}", "RootFS": {{}}, "RepoDigests": []}}' ;;
  "info --format") echo "$OCI" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def _probe(tmp_path: Path, oci_answer: str, oci_when: str | None) -> HostState:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "podman").write_text("#!/bin/sh\n" + PODMAN_STAND_IN)
    (bin_dir / "podman").chmod(0o755)
    cfg = ContainerConfig(image="img:1", runtime="podman", rootless=True, devices=["/dev/kfd"])
    argv = probe_argv(
        cfg,
        "c",
        sshd_port=2224,
        marker_path="/m",
        runtime=ROOTLESS,
        oci=oci_when,  # type: ignore[arg-type]
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "OCI": oci_answer}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    return parse_probe_output("n1", out.returncode, out.stdout, out.stderr)


@pytest.mark.parametrize(("answer", "read"), [("crun", "crun"), ("runc", "runc"), ("$(x) y", None)])
def test_the_real_probe_reads_the_oci_runtime_podman_names(
    tmp_path: Path, answer: str, read: str | None
) -> None:
    state = _probe(tmp_path, answer, "stopped")

    assert state.container == "absent" and state.oci_runtime == read


def test_the_probe_does_not_ask_when_no_launch_needs_devices(tmp_path: Path) -> None:
    assert _probe(tmp_path, "crun", None).oci_runtime is None


def _launching(oci: str | None) -> HostState:
    return HostState(
        "n1",
        access="direct",
        container="absent",
        runtime_name="podman",
        rootless=True,
        oci_runtime=oci,
        tag_image_id=f"sha256:{IMG}",
    )


def test_the_plan_of_a_rootless_gpu_launch_on_runc_says_keep_groups_is_not_sent() -> None:
    cfg = ContainerConfig(
        image="img:1", runtime="podman", rootless=True, lifetime="per_run", gpus={"count": 1}
    )

    runc = decide_plan(cfg, {"n1": _launching("runc")})
    crun = decide_plan(cfg, {"n1": _launching("crun")})

    assert not runc.refused and not crun.refused
    assert any("ignores `--group-add keep-groups`" in w for w in runc.warnings), runc.warnings
    assert not any("keep-groups" in w for w in crun.warnings), crun.warnings
    # The decision is the plan's: the run step only follows it.
    assert (runc.actions["n1"].keep_groups, crun.actions["n1"].keep_groups) == (False, True)


def test_validate_says_keep_groups_is_crun_only_and_what_runc_hosts_rely_on() -> None:
    notes = rootless_notes(
        ContainerConfig(image="img:1", runtime="podman", rootless=True, devices=["/dev/kfd"])
    )

    said = " ".join(notes)
    assert "`--group-add keep-groups`" in said and "runc ignores" in said
    assert "mode 0666" in said
