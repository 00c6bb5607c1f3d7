"""`cvs up --adopt`: running containers cvs did not start are taken over, not refused."""

from __future__ import annotations

import pytest
from plan_states import IMG_B, cfg, host, kinds, states

from orchestrator.cli.common import cli_text
from orchestrator.containers.labels import LABEL_OWNER
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.remote.frames import parse_sections
from orchestrator.remote.records import adopted_argv, adopted_records

ID = "c" * 64


def cvs_started(name: str, **kw: object) -> object:
    """What CVS leaves: a same-named running container, no cvs labels, no marker."""
    return host(name, "running", ours=False, marker=None, **kw)  # type: ignore[arg-type]


def test_adopt_takes_over_running_foreign_containers_and_provisions_them() -> None:
    plan = decide_plan(cfg("persistent"), states(cvs_started("a"), cvs_started("b")), adopt=True)
    assert not plan.refused, plan.reasons
    assert kinds(plan) == {"a": "attach", "b": "attach"}
    assert all(a.adopt and a.provision and a.start_sshd for a in plan.actions.values())
    # A Python caller reads the keyword; the CLI the flag.
    assert any(str(w).startswith("adopt=True: taking over") for w in plan.warnings)
    assert any(cli_text(w).startswith("--adopt: taking over") for w in plan.warnings)


def test_adopt_next_to_our_own_containers_adopts_only_the_foreign_ones() -> None:
    plan = decide_plan(
        cfg("persistent"), states(host("a", "running"), cvs_started("b")), adopt=True
    )
    assert not plan.refused, plan.reasons
    assert (plan.actions["a"].adopt, plan.actions["b"].adopt) == (False, True)


def test_without_adopt_the_refusal_names_it() -> None:
    plan = decide_plan(cfg("persistent"), states(cvs_started("a"), cvs_started("b")))
    assert plan.refused
    ways = [o.name for r in plan.refusals for w in r.ways_out for o in w.options]
    assert "adopt" in ways


def test_adopt_still_refuses_image_skew() -> None:
    plan = decide_plan(
        cfg("persistent"), states(cvs_started("a"), cvs_started("b", image=IMG_B)), adopt=True
    )
    assert plan.refused
    assert any("image" in r for r in plan.reasons)


def test_adopt_does_not_take_a_stopped_foreign_container() -> None:
    stopped = host("b", "exited", ours=False, marker=None)
    plan = decide_plan(cfg("persistent"), states(cvs_started("a"), stopped), adopt=True)
    assert plan.refused


def test_probe_reads_adoption_records() -> None:
    sections, _ = parse_sections(f"@@cvs:adopted {ID} my-cluster\n@@cvs:done\n")
    assert adopted_records(sections) == {ID: "my-cluster"}
    sections, _ = parse_sections("@@cvs:adopted not-an-id x\n@@cvs:done\n")
    assert adopted_records(sections) == {}


@pytest.mark.parametrize("bad", [None, "abc", "C" * 64, ID + ";x"])
def test_adoption_record_needs_a_container_id(bad: str | None) -> None:
    with pytest.raises(ValueError):
        adopted_argv(bad, "c")


def test_adoption_record_quotes_the_cluster_name() -> None:
    argv = adopted_argv(ID, "a b'c")
    assert argv[-3:] == ["adopted", ID, "a b'c"] and LABEL_OWNER not in argv[2]
