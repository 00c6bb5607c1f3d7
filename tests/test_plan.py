"""The planner: every row of the lifetime table, every refusal, and properties."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_states import CLUSTER, IMG_A, IMG_B, OTHER_SHA, SHA, cfg, host, kinds, states
from properties import examples

from orchestrator.cli.common import cli_reasons, cli_text
from orchestrator.config import ContainerConfig
from orchestrator.containers.labels import LABEL_CONFIG_HASH, managed_labels
from orchestrator.containers.plan.down import decide_down
from orchestrator.containers.plan.images import check_tag_identity
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.probe import HostState

REBUILD = "`cvs down --force && cvs up`"  # the way out, as the CLI shows it
API_REBUILD = "`down(force=True)` then `up()`"  # the same, as a Python caller reads it


# --- the lifetime table, row by row ------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    lifetime: str
    hosts: tuple[HostState, ...]
    expect: dict[str, str] | None  # host -> action kind; None = refused
    force: bool = False
    mentions: tuple[str, ...] = ()  # words the refusal reasons must contain


R, E, A, P = "running", "exited", "absent", "other"
ROWS = [
    # no_launch: verify running everywhere; never starts anything.
    Row("no_launch all running -> verify", "no_launch",
        (host("h1", R), host("h2", R)), {"h1": "verify", "h2": "verify"}),
    Row("no_launch one absent -> refuse", "no_launch",
        (host("h1", R), host("h2", A)), None, mentions=("h2", "no_launch", "absent")),
    Row("no_launch one exited -> refuse", "no_launch",
        (host("h1", R), host("h2", E)), None, mentions=("h2", "exited")),
    Row("no_launch force changes nothing", "no_launch",
        (host("h1", A),), None, force=True, mentions=("h1",)),
    Row("no_launch foreign running -> verify", "no_launch",
        (host("h1", R, ours=False),), {"h1": "verify"}),
    Row("no_launch unknown -> refuse", "no_launch",
        (host("h1", R), host("h2", None)), None, mentions=("h2", "never treated as absent")),
    Row("no_launch skew -> refuse", "no_launch",
        (host("h1", R), host("h2", R, image=IMG_B)), None, mentions=("skew", "h1", "h2")),
    # per_run: start fresh everywhere; replace only our own without force.
    Row("per_run all absent -> cold start", "per_run",
        (host("h1", A), host("h2", A)), {"h1": "cold_start", "h2": "cold_start"}),
    Row("per_run ours running/exited -> replace", "per_run",
        (host("h1", R), host("h2", E), host("h3", A)),
        {"h1": "replace", "h2": "replace", "h3": "cold_start"}),
    Row("per_run foreign -> refuse", "per_run",
        (host("h1", A), host("h2", R, ours=False)), None, mentions=("h2", "--force")),
    Row("per_run foreign with force -> replace", "per_run",
        (host("h1", A), host("h2", R, ours=False)), {"h1": "cold_start", "h2": "replace"},
        force=True),
    Row("per_run unknown -> refuse", "per_run",
        (host("h1", A), host("h2", None)), None, mentions=("h2",)),
    Row("per_run tag differs, nothing to pull -> refuse", "per_run",
        (host("h1", A), host("h2", A, tag=IMG_B)), None, mentions=("different images",)),
    # persistent
    Row("persistent all running -> attach", "persistent",
        (host("h1", R), host("h2", R)), {"h1": "attach", "h2": "attach"}),
    Row("persistent none present -> cold start", "persistent",
        (host("h1", A), host("h2", A)), {"h1": "cold_start", "h2": "cold_start"}),
    Row("persistent all exited -> restart", "persistent",
        (host("h1", E), host("h2", E)), {"h1": "restart", "h2": "restart"}),
    Row("persistent created-never-started counts as exited", "persistent",
        (host("h1", E, status="created"), host("h2", E)), {"h1": "restart", "h2": "restart"}),
    Row("persistent partial (running + absent) -> refuse", "persistent",
        (host("h1", R), host("h2", R), host("h3", A)), None,
        mentions=("running: h1, h2", "absent: h3", REBUILD, "docker start")),
    # A node reboot (or dockerd restart) heals: resume the stopped ones, attach the rest.
    Row("persistent mix (running + exited) -> restart the exited, attach the rest", "persistent",
        (host("h1", R), host("h2", E), host("h3", R)),
        {"h1": "attach", "h2": "restart", "h3": "attach"}),
    Row("persistent mix (running + created) -> restart the created", "persistent",
        (host("h1", R), host("h2", E, status="created")), {"h1": "attach", "h2": "restart"}),
    Row("persistent mix (running + paused) -> restart (unpause) the paused", "persistent",
        (host("h1", R), host("h2", P, status="paused")), {"h1": "attach", "h2": "restart"}),
    Row("persistent mix (exited + paused) -> restart both", "persistent",
        (host("h1", E), host("h2", P, status="paused")), {"h1": "restart", "h2": "restart"}),
    Row("persistent mix (running + exited + absent) -> refuse", "persistent",
        (host("h1", R), host("h2", E), host("h3", A)), None,
        mentions=("running: h1", "exited: h2", "absent: h3")),
    Row("persistent mix (running + restarting) -> refuse", "persistent",
        (host("h1", R), host("h2", P, status="restarting")), None,
        mentions=("restarting: h2",)),
    Row("persistent mix (running + dead) -> refuse", "persistent",
        (host("h1", R), host("h2", P, status="dead")), None, mentions=("dead: h2",)),
    Row("persistent mix (running + exited), skew -> refuse", "persistent",
        (host("h1", R), host("h2", E, image=IMG_B)), None, mentions=("skew", "h1", "h2")),
    Row("persistent mix (running + exited), unreadable image -> refuse", "persistent",
        (host("h1", R), host("h2", E, image=None, readable=False)), None,
        mentions=("cannot read the image", "h2")),
    Row("persistent mix (running + exited) + unknown -> refuse", "persistent",
        (host("h1", R), host("h2", E), host("h3", None)), None, mentions=("h3",)),
    Row("persistent mix (running + foreign exited) -> refuse", "persistent",
        (host("h1", R), host("h2", E, ours=False)), None, mentions=("h2", "not created by cvs")),
    Row("persistent partial with force -> replace everywhere", "persistent",
        (host("h1", R), host("h2", E), host("h3", A)),
        {"h1": "replace", "h2": "replace", "h3": "cold_start"}, force=True),
    Row("persistent paused everywhere -> restart (unpause)", "persistent",
        (host("h1", P, status="paused"), host("h2", P, status="paused")),
        {"h1": "restart", "h2": "restart"}),
    Row("persistent restarting everywhere -> refuse", "persistent",
        (host("h1", P, status="restarting"),), None, mentions=("restarting: h1",)),
    Row("persistent daemon down on one -> refuse", "persistent",
        (host("h1", R), host("h2", None)), None, mentions=("h2", "daemon")),
    Row("persistent daemon down, force -> still refuse", "persistent",
        (host("h1", R), host("h2", None)), None, force=True, mentions=("h2",)),
    Row("persistent unreachable -> refuse", "persistent",
        (host("h1", R), HostState.unreachable("h2", "timed out")), None,
        mentions=("h2", "timed out")),
    Row("persistent foreign running -> refuse", "persistent",
        (host("h1", R, ours=False),), None, mentions=("h1", "not created by cvs")),
    Row("persistent other cluster's container is foreign", "persistent",
        (host("h1", R, labels=managed_labels("other")),), None, mentions=("h1",)),
    Row("persistent skew -> refuse with host -> id", "persistent",
        (host("h1", R), host("h2", R, image=IMG_B)), None,
        mentions=("skew", "aaaaaaaaaaaa on h1", "bbbbbbbbbbbb on h2")),
    Row("persistent skew with force -> replace", "persistent",
        (host("h1", R), host("h2", R, image=IMG_B)), {"h1": "replace", "h2": "replace"},
        force=True),
    Row("persistent skew among exited -> refuse", "persistent",
        (host("h1", E), host("h2", E, image=IMG_B)), None, mentions=("skew",)),
    Row("persistent unreadable image -> refuse", "persistent",
        (host("h1", R), host("h2", R, image=None, readable=False)), None,
        mentions=("cannot read the image", "h2")),
    Row("persistent cold start, tags differ -> refuse", "persistent",
        (host("h1", A), host("h2", A, tag=IMG_B)), None, mentions=("h1", "h2")),
    Row("persistent cold start, tags differ, force does not waive", "persistent",
        (host("h1", R), host("h2", A, tag=IMG_B)), None, force=True,
        mentions=("different images",)),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_lifetime_table(row: Row) -> None:
    plan = decide_plan(cfg(row.lifetime), states(*row.hosts), force=row.force)
    if row.expect is None:
        assert plan.refused, plan
        assert plan.exit_code == 4
        assert all(a.kind == "none" for a in plan.actions.values())
        text = " ".join(cli_reasons(plan.refusals))  # as the CLI says them
        for word in row.mentions:
            assert word in text, (word, plan.reasons)
        assert all("\n" not in r for r in plan.reasons)
    else:
        assert not plan.refused, plan.reasons
        assert plan.exit_code == 0
        assert kinds(plan) == row.expect


# --- specifics ---------------------------------------------------------------


def test_replace_removes_first_and_cold_start_does_not() -> None:
    plan = decide_plan(cfg("per_run"), states(host("h1", R), host("h2", A)))
    assert plan.actions["h1"].remove_first and plan.actions["h1"].launches
    assert not plan.actions["h2"].remove_first and plan.actions["h2"].launches


def test_attach_removes_nothing_and_launches_nothing() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", R), host("h2", R)))
    for action in plan.actions.values():
        assert not action.removes and not action.launches


def test_stale_container_warns_with_rebuild_command_and_attaches() -> None:
    plan = decide_plan(
        cfg("persistent"), states(host("h1", R, tag=IMG_B), host("h2", R, tag=IMG_B))
    )
    assert not plan.refused
    assert kinds(plan) == {"h1": "attach", "h2": "attach"}
    (warning,) = plan.warnings
    assert "stale" in warning and "h1, h2" in warning and API_REBUILD in warning
    assert "bbbbbbbbbbbb" in warning
    assert REBUILD in cli_text(warning) and "force=True" not in cli_text(warning)


def test_stale_under_no_launch_does_not_suggest_cvs_rebuild() -> None:
    plan = decide_plan(cfg("no_launch"), states(host("h1", R, tag=IMG_B)))
    assert not plan.refused
    assert "stale" in plan.warnings[0] and API_REBUILD not in plan.warnings[0]
    assert REBUILD not in cli_text(plan.warnings[0])


def test_tag_check_waits_for_the_pull_when_pull_is_always() -> None:
    hs = states(host("h1", A), host("h2", A, tag=IMG_B))
    assert not decide_plan(cfg("persistent", pull="always"), hs).refused


def test_tag_check_waits_for_the_pull_when_a_host_lacks_the_tag() -> None:
    hs = states(host("h1", A), host("h2", A, tag=None))
    assert not decide_plan(cfg("per_run"), hs).refused


def test_fresh_launch_provisions_and_starts_sshd_on_multi_host() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", A), host("h2", A)))
    assert all(a.provision and a.start_sshd for a in plan.actions.values())


def test_single_host_skips_sshd_unless_configured() -> None:
    one = states(host("h1", A))
    assert not decide_plan(cfg("per_run"), one).actions["h1"].start_sshd
    on = cfg("per_run", sshd={"enabled": True})
    assert decide_plan(on, one).actions["h1"].start_sshd


def test_attach_restarts_sshd_only_where_it_does_not_listen() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", R), host("h2", R, sshd=False)))
    assert not plan.actions["h1"].start_sshd
    assert plan.actions["h2"].start_sshd


def test_reprovision_installs_the_sshd_files_again_where_an_sshd_listens() -> None:
    # The way out of an impostor host key (issue 42, item 8): the key is installed again.
    hs = states(host("h1", R), host("h2", R))
    plan = decide_plan(cfg("persistent"), hs, reprovision=True)
    assert all(a.provision and a.start_sshd for a in plan.actions.values())


def test_healing_says_where_it_resumes_and_keeps_the_others_attached() -> None:
    hs = states(host("h1", R), host("h2", E), host("h3", P, status="paused"))
    plan = decide_plan(cfg("persistent"), hs)
    assert kinds(plan) == {"h1": "attach", "h2": "restart", "h3": "restart"}
    assert not plan.actions["h2"].unpause and "`docker start`" in plan.actions["h2"].reason
    assert plan.actions["h3"].unpause and "`docker unpause`" in plan.actions["h3"].reason
    assert not plan.actions["h1"].start_sshd  # its sshd listens: left alone
    assert plan.actions["h2"].start_sshd and plan.actions["h3"].start_sshd
    (healing,) = [w for w in plan.warnings if w.startswith("healing")]
    assert "exited on h2" in healing and "paused on h3" in healing


def test_healing_provisions_only_where_the_marker_is_missing() -> None:
    hs = states(host("h1", R), host("h2", E), host("h3", E, marker=None))
    plan = decide_plan(cfg("persistent"), hs, script_sha256=SHA)
    assert [h for h, a in plan.actions.items() if a.provision] == ["h3"]


def test_no_launch_reports_which_hosts_are_exited_and_starts_nothing() -> None:
    hs = states(host("h1", R), host("h2", E), host("h3", E), host("h4", P, status="paused"))
    plan = decide_plan(cfg("no_launch"), hs)
    assert plan.refused and all(a.kind == "none" for a in plan.actions.values())
    (reason,) = plan.reasons
    assert "exited on h2, h3" in reason and "paused on h4" in reason and "h1" not in reason


def test_restart_always_starts_sshd() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", E), host("h2", E)))
    assert all(a.start_sshd for a in plan.actions.values())


def test_attach_without_marker_provisions_again() -> None:
    plan = decide_plan(
        cfg("persistent"), states(host("h1", R), host("h2", R, marker=None)), script_sha256=SHA
    )
    assert not plan.actions["h1"].provision
    assert plan.actions["h2"].provision


def test_attach_with_other_script_warns_and_leaves_it() -> None:
    hs = states(host("h1", R, marker=OTHER_SHA), host("h2", R))
    plan = decide_plan(cfg("persistent"), hs, script_sha256=SHA)
    assert not any(a.provision for a in plan.actions.values())
    (warning,) = plan.warnings
    assert "provisioned with 222222222222" in warning and "config says 111111111111" in warning
    assert "`up(reprovision=True)`" in warning and "h1" in warning and "h2" not in warning
    assert "`cvs up --reprovision`" in cli_text(warning)


def test_reprovision_runs_the_script_on_every_kept_container() -> None:
    hs = states(host("h1", R, marker=OTHER_SHA), host("h2", R))
    plan = decide_plan(cfg("persistent"), hs, script_sha256=SHA, reprovision=True)
    assert all(a.provision for a in plan.actions.values())


def test_restart_keeps_a_provisioned_container_as_is() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", E), host("h2", E)), script_sha256=SHA)
    assert not any(a.provision for a in plan.actions.values())


def test_config_drift_warns_on_attach() -> None:
    drifted = {**managed_labels(CLUSTER), LABEL_CONFIG_HASH: "old"}
    hs = states(host("h1", R, labels=drifted), host("h2", R, labels=managed_labels(CLUSTER, "new")))
    plan = decide_plan(cfg("persistent"), hs, config_hash="new")
    assert not plan.refused
    assert any("config drift" in w and "h1" in w and "h2" not in w for w in plan.warnings)


def test_persistent_without_name_warns() -> None:
    plan = decide_plan(ContainerConfig(image="img:1", lifetime="persistent"), states(host("h1", A)))
    assert any("container.name" in w for w in plan.warnings)


def test_unknown_hosts_are_listed_on_the_plan() -> None:
    plan = decide_plan(cfg("persistent"), states(host("h1", R), host("h2", None)))
    assert plan.unknown_hosts == ("h2",)


def test_many_hosts_keep_reasons_to_one_line() -> None:
    hs = states(*(host(f"h{i:03}", R) for i in range(200)), host("h999", A))
    plan = decide_plan(cfg("persistent"), hs)
    assert plan.refused and len(plan.reasons) == 1
    assert "and 188 more" in plan.reasons[0] and "absent: h999" in plan.reasons[0]


# --- tag identity before a cold start ------------------------------------------


def test_tag_identity_same_id_everywhere_is_fine() -> None:
    assert check_tag_identity(states(host("h1", A), host("h2", A))) == []


def test_tag_identity_different_ids_sharing_a_repo_digest_is_fine() -> None:
    d = ("reg/img@sha256:" + "c" * 64,)
    hs = states(host("h1", A, digests=d), host("h2", A, tag=IMG_B, digests=d))
    assert check_tag_identity(hs) == []


def test_tag_identity_different_ids_is_refused_with_host_to_id() -> None:
    hs = states(host("h1", A), host("h2", A, tag=IMG_B), host("h3", A))
    (reason,) = (r.render() for r in check_tag_identity(hs, image="img:1"))
    assert "img:1" in reason
    assert "aaaaaaaaaaaa on h1, h3" in reason and "bbbbbbbbbbbb on h2" in reason


def test_tag_identity_missing_image_is_refused() -> None:
    (reason,) = (
        r.render() for r in check_tag_identity(states(host("h1", A), host("h2", A, tag=None)))
    )
    assert "not present on h2" in reason


def test_tag_identity_unknown_host_is_refused() -> None:
    reasons = [r.render() for r in check_tag_identity(states(host("h1", A), host("h2", None)))]
    assert any("h2" in r for r in reasons)


# --- cvs down ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("lifetime", "force", "expect"),
    [
        ("per_run", False, {"h1": "remove", "h2": "none", "h3": "none"}),
        ("per_run", True, {"h1": "remove", "h2": "remove", "h3": "none"}),
        ("persistent", False, {"h1": "none", "h2": "none", "h3": "none"}),
        ("persistent", True, {"h1": "remove", "h2": "remove", "h3": "none"}),
        ("no_launch", False, {"h1": "none", "h2": "none", "h3": "none"}),
        ("no_launch", True, {"h1": "none", "h2": "none", "h3": "none"}),
    ],
)
def test_down(lifetime: str, force: bool, expect: dict[str, str]) -> None:
    hs = states(host("h1", R), host("h2", E, ours=False), host("h3", A))
    plan = decide_down(cfg(lifetime), hs, force=force)
    assert not plan.refused
    assert kinds(plan) == expect


def test_down_keeps_foreign_and_says_how_to_remove_it() -> None:
    plan = decide_down(cfg("per_run"), states(host("h1", R, ours=False)))
    assert any("`down(force=True)` removes it" in w and "h1" in w for w in plan.warnings)
    assert any("`cvs down --force` removes it" in cli_text(w) for w in plan.warnings)


def test_down_skips_unknown_hosts_and_reports_them() -> None:
    plan = decide_down(cfg("per_run"), states(host("h1", R), host("h2", None)), force=True)
    assert kinds(plan) == {"h1": "remove", "h2": "none"}
    assert plan.unknown_hosts == ("h2",)
    assert any("h2" in w for w in plan.warnings)


# --- properties --------------------------------------------------------------

CONTAINER_STATES = st.sampled_from([None, "absent", "running", "exited", "other"])


@st.composite
def host_states(draw: st.DrawFn) -> dict[str, HostState]:
    n = draw(st.integers(min_value=1, max_value=6))
    out: dict[str, HostState] = {}
    for i in range(n):
        name = f"h{i}"
        if draw(st.booleans()) and draw(st.integers(0, 9)) == 0:
            out[name] = HostState.unreachable(name, "down")
            continue
        container = draw(CONTAINER_STATES)
        # docker's word, consistent with the coarse state as ContainerInfo.state maps it.
        words = {"exited": ["exited", "created"], "other": ["paused", "restarting", "dead"]}
        status = draw(st.sampled_from(words[container])) if container in words else None
        out[name] = host(
            name,
            container,
            ours=draw(st.booleans()),
            image=draw(st.sampled_from([IMG_A, IMG_B, None])),
            tag=draw(st.sampled_from([IMG_A, IMG_B, None])),
            marker=draw(st.sampled_from([SHA, OTHER_SHA, None])),
            sshd=draw(st.sampled_from([True, False, None])),
            status=status,
            readable=draw(st.booleans()),
        )
    return out


LIFETIMES = st.sampled_from(["no_launch", "per_run", "persistent"])


@settings(max_examples=examples(400), deadline=None)
@given(hs=host_states(), reprovision=st.booleans(), pull=st.sampled_from(["missing", "always"]))
def test_persistent_containers_are_never_removed_without_force(
    hs: dict[str, HostState], reprovision: bool, pull: str
) -> None:
    plan = decide_plan(cfg("persistent", pull=pull), hs, reprovision=reprovision)
    for name, action in plan.actions.items():
        assert not action.removes, (name, action)
        if hs[name].container in ("running", "exited", "other"):
            assert action.kind in ("attach", "restart", "none"), (name, action)
    down = decide_down(cfg("persistent"), hs)
    assert not any(a.removes for a in down.actions.values())


@settings(max_examples=examples(400), deadline=None)
@given(hs=host_states(), lifetime=LIFETIMES, force=st.booleans())
def test_unknown_host_always_refuses_persistent_and_no_launch(
    hs: dict[str, HostState], lifetime: str, force: bool
) -> None:
    plan = decide_plan(cfg(lifetime), hs, force=force)
    if lifetime in ("persistent", "no_launch") and any(not s.known for s in hs.values()):
        assert plan.refused
        assert set(plan.unknown_hosts) == {h for h, s in hs.items() if not s.known}


@settings(max_examples=examples(400), deadline=None)
@given(hs=host_states(), lifetime=LIFETIMES, force=st.booleans())
def test_plan_invariants(hs: dict[str, HostState], lifetime: str, force: bool) -> None:
    plan = decide_plan(cfg(lifetime), hs, force=force)
    assert list(plan.actions) == list(hs)
    if plan.refused:
        assert plan.reasons and all(a.kind == "none" for a in plan.actions.values())
    for name, action in plan.actions.items():
        state = hs[name]
        if action.removes:
            # Only containers we know about, and foreign ones only with force.
            assert state.known and state.container != "absent"
            assert force or state.labels.get("io.cvs.managed") == CLUSTER
        if lifetime == "no_launch":
            assert action.kind in ("verify", "none")
        if action.kind == "cold_start":
            assert state.container == "absent" and action.provision
        if action.kind == "attach":
            assert state.container == "running"
        if action.kind == "restart":
            assert state.container == "exited" or state.container_status == "paused"
            assert action.unpause == (state.container_status == "paused")


@settings(max_examples=examples(400), deadline=None)
@given(hs=host_states())
def test_persistent_heals_exactly_when_every_container_is_ours_present_and_resumable(
    hs: dict[str, HostState],
) -> None:
    """Reference: resume (restart) every stopped/paused container and attach the
    running ones iff all hosts are known, every container is present, ours and
    running/exited/created/paused, and images are readable and agree."""
    plan = decide_plan(cfg("persistent"), hs)
    words = {
        h: s.container if s.container != "other" else s.container_status for h, s in hs.items()
    }
    healable = (
        all(s.known for s in hs.values())
        and set(words.values()) <= {"running", "exited", "paused"}
        and all(s.labels.get("io.cvs.managed") == CLUSTER for s in hs.values())
        and all(s.container_image_readable for s in hs.values())
        and len({s.container_image_id for s in hs.values()}) == 1
    )
    if healable:
        assert not plan.refused, plan.reasons
        expect = {h: "attach" if w == "running" else "restart" for h, w in words.items()}
        assert kinds(plan) == expect
    elif not all(s.known and s.container == "absent" for s in hs.values()):
        assert plan.refused


@settings(max_examples=examples(200), deadline=None)
@given(hs=host_states(), lifetime=LIFETIMES, force=st.booleans())
def test_down_never_removes_foreign_or_unknown_without_force(
    hs: dict[str, HostState], lifetime: str, force: bool
) -> None:
    plan = decide_down(cfg(lifetime), hs, force=force)
    for name, action in plan.actions.items():
        if action.removes:
            assert hs[name].known and hs[name].container != "absent"
            assert lifetime != "no_launch"
            assert force or (
                lifetime == "per_run" and hs[name].labels.get("io.cvs.managed") == CLUSTER
            )


# --- what `cvs down` leaves behind --------------------------------------------


def test_down_leftovers_name_unknown_and_failed_hosts_and_how_to_finish() -> None:
    from orchestrator.containers.plan.down import down_leftovers

    hs = states(host("h1", R), HostState.unreachable("h2", "connection refused"), host("h3", R))
    plan = decide_down(cfg("persistent"), hs, force=True)
    left = down_leftovers(
        cfg("persistent"), plan, {"h1": (True, None), "h3": (False, "dockerd gone")}, force=True
    )
    assert set(left) == {"h2", "h3"}
    assert "may still be there" in left["h2"] and "connection refused" in left["h2"]
    assert "rerun `down(force=True)`" in left["h2"]
    assert "rerun `cvs down --force`" in cli_text(left["h2"])
    assert "removing it failed (dockerd gone)" in left["h3"]


def test_down_leftovers_take_the_unknown_hosts_reason_from_the_plan_not_its_words() -> None:
    from orchestrator.containers.plan.down import down_leftovers

    hs = states(HostState.unreachable("h2", "state unknown: said by sshd"))
    plan = decide_down(cfg("persistent"), hs, force=True)
    assert plan.unknown_why == {"h2": "state unknown: said by sshd"}
    (left,) = down_leftovers(cfg("persistent"), plan, {}, force=True).values()
    # the probe's words whole, even when they read like the action's prefix
    assert "(state unknown: state unknown: said by sshd)" in cli_text(left)


def test_down_leftovers_empty_when_everything_is_gone() -> None:
    from orchestrator.containers.plan.down import down_leftovers

    hs = states(host("h1", R), host("h2", A))
    plan = decide_down(cfg("per_run"), hs)
    assert down_leftovers(cfg("per_run"), plan, {"h1": (True, None)}, force=False) == {}


def test_down_leftovers_list_kept_containers_with_the_reason() -> None:
    from orchestrator.containers.plan.down import down_leftovers

    plan = decide_down(cfg("persistent"), states(host("h1", R)))
    (text,) = down_leftovers(cfg("persistent"), plan, {}, force=False).values()
    assert "kept" in text and "`down(force=True)` removes" in text
    assert "`cvs down --force` removes" in cli_text(text)
