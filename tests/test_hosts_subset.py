"""Issue 30, finding 2, the pure part: `up --hosts` decides over every host
and acts on the chosen ones; it never makes what a plain `up` would refuse.
The real hosts are in tests/test_edges_sandbox.py."""

from __future__ import annotations

from plan_states import cfg, host, kinds, states

from orchestrator.cli.common import CLI_STYLE
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.plan.model import Plan
from orchestrator.containers.probe import HostState
from orchestrator.containers.subset import narrowed


def test_a_missing_member_of_a_persistent_set_is_refused_as_a_plain_up_refuses_it() -> None:
    probed = states(host("n1", "running"), host("n2", "running"), host("n3", "absent"))
    whole = decide_plan(cfg("persistent"), probed)
    plan = narrowed(whole, ["n3"], "ctr")
    assert plan.refused and [r.kind for r in plan.refusals] == [r.kind for r in whole.refusals]
    text = plan.refusals[0].render(CLI_STYLE)
    # Every way out is true for this command: none is "the same again with --force",
    # which would keep --hosts and be refused; --heal is (it goes with --hosts).
    assert "rerun with --force" not in text and "(`cvs up --force`)" in text, text
    assert "rerun with --heal to start it where it is missing" in text, text


def test_a_fresh_persistent_set_is_not_started_on_part_of_the_hosts() -> None:
    probed = states(host("n1", "absent"), host("n2", "absent"), host("n3", "absent"))
    plan = narrowed(decide_plan(cfg("persistent"), probed), ["n3"], "ctr")
    assert plan.refused and [r.kind for r in plan.refusals] == ["partial_set_hosts"]
    text = plan.refusals[0].render(CLI_STYLE)
    assert "would start on n3 only (--hosts), while n1, n2 need the same start" in text, text
    assert text.endswith("start it on every host at once (`cvs up`)"), text


def test_force_on_part_of_a_persistent_set_is_refused_rather_than_mixing_images() -> None:
    probed = states(host("n1", "running"), host("n2", "running"), host("n3", "absent"))
    plan = narrowed(decide_plan(cfg("persistent"), probed, force=True), ["n3"], "ctr")
    assert plan.refused and [r.kind for r in plan.refusals] == ["partial_set_hosts"]


def test_a_stopped_member_is_resumed_on_the_chosen_host_alone() -> None:
    probed = states(
        host("n1", "running"), host("n2", "running"), host("n3", "exited", status="exited")
    )
    plan = narrowed(decide_plan(cfg("persistent"), probed), ["n3"], "ctr")
    assert not plan.refused and kinds(plan) == {"n3": "restart"}


def test_per_run_containers_start_on_the_chosen_hosts() -> None:
    probed = states(host("n1", "absent"), host("n2", "absent"), host("n3", "absent"))
    plan = narrowed(decide_plan(cfg("per_run"), probed), ["n2", "n3"], "ctr")
    assert not plan.refused and kinds(plan) == {"n2": "cold_start", "n3": "cold_start"}


def test_plan_names_an_image_on_no_host_and_pull_never_as_not_found() -> None:
    """Issue 30, finding 6: `plan` named nothing for a tag no host has."""
    absent = states(
        host("n1", "absent", tag=None), host("n2", "absent", tag=None), host("n3", "absent")
    )
    never = decide_plan(cfg("persistent", pull="never"), absent)
    assert never.refused and "image img:1 not found on n1, n2" in never.reasons[0]
    nowhere = states(*(host(h, "absent", tag=None) for h in ("n1", "n2", "n3")))
    pulled = decide_plan(cfg("persistent"), nowhere)
    assert not pulled.refused
    assert "image img:1 is on none of n1, n2, n3: up pulls it from docker.io" in pulled.warnings


def test_a_persistent_set_under_a_per_run_file_is_one_refusal_with_true_ways_out() -> None:
    """Issue 30, finding 7: two refusals (one offering --force, which the other
    says never works) and `not created by cvs`, which was false."""
    from orchestrator.containers.labels import managed_labels

    labels = managed_labels("cvs", lifetime="persistent")
    probed = states(*(host(h, "running", labels=labels) for h in ("n1", "n2", "n3")))
    plan = decide_plan(cfg("per_run"), probed, cluster_name="cvs")
    assert [r.kind for r in plan.refusals] == ["persistent_kept"], plan.reasons
    text = plan.refusals[0].render(CLI_STYLE)
    assert "--force to" not in text and "rerun" not in text, text
    assert "whose container.lifetime is persistent" in text, text
    assert {a.reason for a in plan.actions.values()} == {
        "running (created by cvs for cluster 'cvs', lifetime persistent)"
    }


def test_a_host_left_out_that_cannot_be_read_does_not_stop_an_attach_but_stops_a_start() -> None:
    """`-x node3` while node3 is down: the others keep working; a fresh set is not
    started next to a host whose state nobody knows."""
    from orchestrator.containers.subset import deciding, unread

    running = states(host("n1", "running"), host("n2", "running"), host("n3", None))
    plan = decide_plan(cfg("persistent"), deciding(running, ["n1", "n2"]))
    plan = narrowed(plan, ["n1", "n2"], "ctr", unread(running, ["n1", "n2"]))
    assert not plan.refused and kinds(plan) == {"n1": "attach", "n2": "attach"}

    fresh = states(host("n1", "absent"), host("n2", "absent"), host("n3", None))
    plan = decide_plan(cfg("persistent"), deciding(fresh, ["n1", "n2"]))
    plan = narrowed(plan, ["n1", "n2"], "ctr", unread(fresh, ["n1", "n2"]))
    assert plan.refused and "while n3 need the same start or cannot be read" in plan.reasons[0]


# --- up --heal: the explicit way to complete a running persistent set ---------------


def heal_plan(probed: dict[str, HostState], only: list[str] | None, **kw: object) -> Plan:
    from orchestrator.containers.subset import deciding, healed, unread

    config = cfg("persistent", **kw)
    plan = decide_plan(config, deciding(probed, only), cluster_name="cvs")
    plan = healed(plan, deciding(probed, only), only, config, sshd=True, cluster_name="cvs")
    return plan if only is None else narrowed(plan, only, "ctr", unread(probed, only))


def test_heal_starts_a_missing_member_alone_with_sshd_and_the_sets_image() -> None:
    probed = states(host("n1", "running"), host("n2", "running"), host("n3", "absent"))
    for only in (["n3"], None):
        plan = heal_plan(probed, only)
        assert not plan.refused, plan.reasons
        assert plan.actions["n3"].kind == "cold_start" and plan.actions["n3"].start_sshd
        assert plan.actions["n3"].provision
        assert all(a.kind == "attach" for h, a in plan.actions.items() if h != "n3")
        assert any("starting container ctr on n3, where it is missing" in w for w in plan.warnings)


def test_heal_refuses_a_tag_that_is_not_the_sets_image() -> None:
    from plan_states import IMG_B

    probed = states(host("n1", "running"), host("n2", "running"), host("n3", "absent", tag=IMG_B))
    plan = heal_plan(probed, ["n3"])
    assert plan.refused and [r.kind for r in plan.refusals] == ["heal_image"]
    assert "(`cvs up --force`)" in plan.refusals[0].render(CLI_STYLE)


def test_heal_leaves_other_refusals_alone() -> None:
    probed = states(host("n1", "running"), host("n2", "absent"), host("n3", "absent", ours=False))
    assert heal_plan(probed, ["n2"]).refused
    nothing_missing = states(host("n1", "running"), host("n2", "running"))
    assert kinds(heal_plan(nothing_missing, ["n2"])) == {"n2": "attach"}
