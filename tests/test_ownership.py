"""Pure: who owns a container, what needs the lock exclusively, sshd port conflicts,
and the lock program's own pieces (paths, holder lines). No IO."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.config import ContainerConfig
from orchestrator.containers.argv import remove_started_by_command, rm_id_argv
from orchestrator.containers.labels import (
    LABEL_INVOCATION,
    LABEL_LIFETIME,
    LABEL_SSHD_PORT,
    is_ours,
    managed_labels,
)
from orchestrator.containers.locks import (
    describe_holders,
    holder_description,
    lock_command,
    lock_path,
)
from orchestrator.containers.plan.down import decide_down
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.probe import (
    HostState,
    parse_probe_output,
)
from orchestrator.remote.frames import split_lock_frames
from orchestrator.remote.records import forget_listed_command

ID = "a" * 64
NO_SUCH = b"Error: No such object: ctr\nError: No such object: img:1\n"
IDENTITY = "lab"


def cfg(lifetime: str, **kw: object) -> ContainerConfig:
    return ContainerConfig(image="img:1", name="ctr", lifetime=lifetime, **kw)  # type: ignore[arg-type]


def state(host: str, container: str = "running", **kw: object) -> HostState:
    present = container != "absent"
    values: dict[str, object] = {
        "host": host,
        "access": "direct",
        "container": container,
        "container_status": container if present else None,
        "container_id": ID if present else None,
        "container_image_id": "sha256:1" if present else None,
        "tag_image_id": "sha256:1",
        "sshd_listening": True if container == "running" else None,
        "provision_marker": "m" if present else None,
        "labels": managed_labels("cvs") if present else {},
    }
    values.update(kw)
    return HostState(**values)  # type: ignore[arg-type]


# --- labels and ownership ------------------------------------------------------


def test_labels_record_identity_lifetime_invocation_and_sshd_port() -> None:
    labels = managed_labels(IDENTITY, "h", lifetime="per_run", invocation="0f" * 8, sshd_port=22)
    assert labels[LABEL_LIFETIME] == "per_run"
    assert labels[LABEL_INVOCATION] == "0f" * 8
    assert labels[LABEL_SSHD_PORT] == "22"


@pytest.mark.parametrize(
    ("recorded", "ours_as", "expected"),
    [
        ("persistent", "persistent", True),
        ("persistent", "per_run", False),  # the same file switched lifetimes
        ("per_run", "persistent", False),
        (None, "per_run", True),  # made before the lifetime label: identity decides
    ],
)
def test_a_container_is_ours_only_under_the_lifetime_it_was_started_with(
    recorded: str | None, ours_as: str, expected: bool
) -> None:
    labels = managed_labels(IDENTITY, lifetime=recorded)
    assert is_ours(labels, IDENTITY, lifetime=ours_as) is expected
    assert not is_ours(labels, "other", lifetime=ours_as)


def test_per_run_never_replaces_a_persistent_container_even_with_force() -> None:
    labels = managed_labels(IDENTITY, lifetime="persistent")
    hs = {"h1": state("h1", labels=labels)}
    plan = decide_plan(cfg("per_run"), hs, force=True, cluster_name=IDENTITY)
    assert plan.refused and "persistent" in plan.reasons[0] and "h1" in plan.reasons[0]


def test_per_run_down_keeps_a_persistent_container_even_with_force() -> None:
    labels = managed_labels(IDENTITY, lifetime="persistent")
    plan = decide_down(cfg("per_run"), {"h1": state("h1", labels=labels)}, force=True)
    assert plan.hosts("remove") == [] and any("persistent" in w for w in plan.warnings)


def test_removal_is_by_exact_container_id() -> None:
    assert rm_id_argv(["docker"], ID) == ["docker", "rm", "-f", ID]
    for bad in ("ctr", ID[:12], ID + "0", "-f"):
        with pytest.raises(ValueError):
            rm_id_argv(["docker"], bad)


def test_rollback_filters_on_this_invocations_label_and_the_exact_name() -> None:
    text = remove_started_by_command(["docker"], "ctr", "0123456789abcdef")
    assert f"label={LABEL_INVOCATION}=0123456789abcdef" in text
    assert "name=^/ctr$" in text
    with pytest.raises(ValueError):
        remove_started_by_command(["docker"], "ctr", "x; rm -rf /")


def test_rollback_also_drops_the_host_records_of_what_it_removed(tmp_path: Path) -> None:
    # The rollback removes by label, so only the host knows the IDs it removed.
    removed, kept = "a" * 64, "b" * 64
    records = tmp_path / "state" / "cvs"
    for kind in ("provisioned", "adopted"):
        (records / kind).mkdir(parents=True)
        for cid in (removed, kept):
            (records / kind / cid).write_text("x\n")
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\ncase $1 in ps) echo {removed}; echo "bogus;id" ;; esac\n')
    fake.chmod(0o755)
    text = remove_started_by_command(
        [str(fake)], "ctr", "0123456789abcdef", then=forget_listed_command()
    )
    env = {"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(tmp_path / "state")}
    assert subprocess.run(["sh", "-c", text], env=env).returncode == 0
    for kind in ("provisioned", "adopted"):
        assert not (records / kind / removed).exists()
        assert (records / kind / kept).exists()


# --- what needs the lock exclusively -------------------------------------------


def test_an_attach_with_nothing_to_do_changes_nothing() -> None:
    hs = {h: state(h) for h in ("h1", "h2")}
    assert not decide_plan(cfg("persistent"), hs, script_sha256="m").changes


@pytest.mark.parametrize(
    "hs",
    [
        {"h1": state("h1", "absent"), "h2": state("h2", "absent")},  # cold start
        {"h1": state("h1", "exited"), "h2": state("h2", "exited")},  # restart
        {"h1": state("h1"), "h2": state("h2", sshd_listening=False)},  # sshd start
        {"h1": state("h1"), "h2": state("h2", provision_marker=None)},  # provision
    ],
)
def test_starting_restarting_or_provisioning_anything_changes_something(
    hs: dict[str, HostState],
) -> None:
    assert decide_plan(cfg("persistent"), hs, script_sha256="m").changes


# --- sshd port conflicts (network host) -------------------------------------------


def test_a_cold_start_onto_a_taken_sshd_port_is_refused_naming_the_other_cluster() -> None:
    hs = {
        "h1": state("h1", "absent", sshd_port_busy=True, sshd_port_holders=("b-ctr (cluster b)",)),
        "h2": state("h2", "absent", sshd_port_busy=False),
    }
    plan = decide_plan(cfg("persistent"), hs)
    assert plan.refused
    (reason,) = plan.reasons
    assert "2224" in reason and "h1" in reason and "cluster b" in reason and "h2" not in reason


def test_a_taken_port_matters_only_where_sshd_will_start() -> None:
    hs = {"h1": state("h1", "absent", sshd_port_busy=True)}
    assert not decide_plan(cfg("per_run"), hs).refused  # one host: sshd is off


def test_probe_reads_the_port_check_and_its_holders() -> None:
    def frame(name: str, rc: int, out: bytes, err: bytes = b"") -> str:
        b64 = base64.b64encode
        return (
            f"@@cvs:section {name} {rc} b64\n{b64(out).decode()}\n@@cvs:stderr\n"
            f"{b64(err).decode()}\n@@cvs:end {name}\n"
        )

    text = (
        frame("args", 0, b"ctr\nimg:1\n")
        + frame("inspect.direct", 1, b"[]", NO_SUCH)
        + "@@cvs:port yes\n"
        + frame("port_holders", 0, b"other-ctr\tother\n")
        + "@@cvs:done\n"
    )  # fmt: skip
    st_ = parse_probe_output("h1", 0, text, "")
    assert st_.container == "absent" and st_.sshd_port_busy is True
    assert st_.sshd_port_holders == ("other-ctr (cluster other)",)


# --- the lock program's pieces --------------------------------------------------


def test_lock_path_is_per_container_and_host_and_refuses_unsafe_parts() -> None:
    assert lock_path("ctr", "node1") == "/tmp/cvs-ctr-node1.lock"
    for bad in ("a/b", "x y", "", "a;b", "a\n"):
        with pytest.raises(ValueError):
            lock_path(bad, "node1")


@given(st.text(max_size=300))
def test_holder_descriptions_are_one_safe_line(purpose: str) -> None:
    text = holder_description(purpose)
    assert "\n" not in text and "'" not in text and "$" not in text and len(text) <= 200


def test_holder_lines_cannot_forge_lock_frames() -> None:
    # Holder files are printed prefixed, so a file saying "@@cvs:lock held"
    # is a holder line, never the lock's status.
    status, holders, rest = split_lock_frames("@@cvs:holder @@cvs:lock held x\n@@cvs:lock busy\n")
    assert status == "busy" and holders == ["@@cvs:lock held x"] and rest == ""
    assert describe_holders([]) == "another cvs invocation"


def test_lock_command_quotes_everything_it_is_given() -> None:
    text = lock_command("/tmp/cvs-c-h.lock", "shared", wait=None, description="a b; c")
    assert "'a b; c'" in text and " s no " in text


# --- the lock program itself, run locally (POSIX sh + flock, no SSH) ------------


def test_exclusive_holders_never_overlap_while_the_directory_comes_and_goes(
    tmp_path: Path,
) -> None:
    # Every holder removes the directory when it is the last one out, and the
    # next creates it again: mutual exclusion must hold across that churn.
    lock, log = tmp_path / "cvs-x-h.lock", tmp_path / "log"
    body = f'echo "start $$" >> {log}; sleep 0.02; echo "end $$" >> {log}'
    command = lock_command(
        str(lock), "exclusive", wait=60, description="t", probe=["sh", "-c", body, "t"]
    )
    procs = [
        subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        for _ in range(25)
    ]
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]

    assert all("@@cvs:ready" in out for out in outputs)
    words = [line.split()[0] for line in log.read_text().splitlines()]
    assert words == ["start", "end"] * 25
    assert not lock.exists()  # the last one out removed it


def test_shared_holders_overlap_and_a_busy_lock_names_its_holders(tmp_path: Path) -> None:
    lock = tmp_path / "cvs-x-h.lock"
    hold = lock_command(str(lock), "shared", wait=None, description="alice@box pid 1: run a")
    first = subprocess.Popen(["sh", "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    second = subprocess.Popen(["sh", "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for p in (first, second):
            assert p.stdout is not None
            while b"@@cvs:ready" not in p.stdout.readline():
                pass
        busy = subprocess.run(
            ["sh", "-c", lock_command(str(lock), "exclusive", wait=None, description="b")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        status, holders, _ = split_lock_frames(busy.stdout)
        assert status == "busy" and holders == ["alice@box pid 1: run a"] * 2
    finally:
        for p in (first, second):
            p.communicate(timeout=30)  # closing stdin releases
    assert not lock.exists()


def test_a_forged_holder_line_cannot_put_escapes_or_markup_on_the_terminal() -> None:
    # Lock directories are world-writable: another local user can leave any line.
    forged = "\x1b]0;pwned\x07[bold red]root@gpu01[/] pid 1: up" + "x" * 500
    shown = describe_holders([forged, "cvs@ci pid 7: run"])
    assert "\x1b" not in shown and "\x07" not in shown and "[" not in shown
    assert "cvs@ci pid 7: run" in shown and len(shown) <= 300
