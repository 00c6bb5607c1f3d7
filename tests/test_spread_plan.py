"""The spread's decisions, pure (containers/spread_plan.py): the mode, the
seed, the tree's shape from N, the fetches the registry serves, space, refeeds."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.config import ContainerConfig
from orchestrator.containers import spread_plan
from orchestrator.containers.spread_plan import (
    decide_spread,
    fan_out_degree,
    refeed,
    space_shortfalls,
    tree,
)


def cfg(**kw: Any) -> ContainerConfig:
    return ContainerConfig(image="reg.example:5000/cvs:1", **kw)


def hosts(n: int) -> list[str]:
    return [f"node{i}" for i in range(1, n + 1)]


@pytest.mark.parametrize(
    ("distribute", "lacking", "n", "mode", "seed", "fetches", "why"),
    [
        # auto: peers from two hosts lacking the image; one pull.
        ("auto", 4, 4, "peers", "node1", 1, "4 hosts lack it"),
        ("auto", 2, 2, "peers", "node1", 1, "2 hosts lack it"),
        # auto: one host lacking it pulls for itself.
        ("auto", 1, 1, "registry", None, 1, "only one host lacks the image"),
        ("auto", 0, 3, "registry", None, 0, "no host lacks the image"),
        # registry: every host pulls, whatever N.
        ("registry", 4, 4, "registry", None, 4, "container.distribute: registry"),
        ("peers", 3, 3, "peers", "node1", 1, "container.distribute: peers"),
        # One host lacking it pulls itself, even where another has the tag
        # (it must end with what the registry names): nothing to spread.
        ("peers", 1, 2, "registry", None, 1, "only one host lacks the image"),
        ("auto", 1, 2, "registry", None, 1, "only one host lacks the image"),
    ],
)
def test_mode_seed_and_fetches(
    distribute: str, lacking: int, n: int, mode: str, seed: str | None, fetches: int, why: str
) -> None:
    names = hosts(n)
    steps = {h: ("pull" if i < lacking else None) for i, h in enumerate(names)}
    plan = decide_spread(cfg(distribute=distribute), steps)
    assert (plan.mode, plan.seed, plan.registry_fetches, plan.why) == (mode, seed, fetches, why)


def test_the_seed_pulls_even_where_another_host_has_the_tag() -> None:
    # node1 has the tag (pull: missing): node2 pulls, node3 and node4 are fed
    # from it; node1's own tag is left to the skew check.
    steps = {"node1": None, "node2": "pull", "node3": "pull", "node4": "pull"}
    plan = decide_spread(cfg(), steps)
    assert plan.seed == "node2" and plan.registry_fetches == 1
    assert plan.receivers == ("node3", "node4") and plan.registry_fetches_without == 3


def test_image_tar_seed_loads_and_says_so() -> None:
    names = hosts(3)
    plan = decide_spread(cfg(image_tar="/x.tar"), dict.fromkeys(names, "load"))
    assert plan.source == "image_tar"
    assert plan.lines()[0].startswith("image: peers (3 hosts lack it): node1 loads image_tar")


@pytest.mark.parametrize(
    ("n", "k", "depth"),
    [(1, 2, 1), (3, 2, 2), (4, 2, 2), (9, 3, 2), (10, 4, 2), (100, 10, 2), (1000, 32, 2)],
)
def test_tree_shape_follows_from_n(n: int, k: int, depth: int) -> None:
    receivers = [f"r{i}" for i in range(n)]
    feeds = tree("seed", receivers)
    assert fan_out_degree(n) == k
    # Everyone fed exactly once, nobody feeds more than K.
    fed = [c for kids in feeds.values() for c in kids]
    assert sorted(fed) == sorted(receivers) and len(set(fed)) == n
    assert max(len(kids) for kids in feeds.values()) <= k
    parent = {c: f for f, kids in feeds.items() for c in kids}

    def hops(host: str) -> int:
        return 0 if host == "seed" else 1 + hops(parent[host])

    assert max(hops(r) for r in receivers) <= depth


def test_the_four_host_tree_in_host_order() -> None:
    assert tree("node1", ["node2", "node3", "node4"]) == {
        "node1": ("node2", "node3"),
        "node2": ("node4",),
    }


def test_space_short_hosts_are_named_unknown_ones_are_not() -> None:
    gib = 1 << 30
    short = space_shortfalls(10 * gib, {"a": 25 * gib, "b": 15 * gib, "c": None})
    assert list(short) == ["b"]
    assert "15.0 GiB free where the image needs 20.0 GiB" in short["b"]


def test_refeed_spreads_the_failed_over_hosts_that_have_it_never_a_dead_one() -> None:
    names = hosts(5)
    plan = decide_spread(cfg(), dict.fromkeys(names, "pull"))
    again = refeed(plan, ["node3", "node2"], ["node4", "node5", "node2"], dead=["node2"])
    assert again == {"node1": ("node4", "node2"), "node3": ("node5",)}
    assert refeed(plan, [], ["node4"], dead=["node1"]) == {}


def test_plan_lines_show_the_tree_and_the_saving() -> None:
    names = hosts(4)
    plan = decide_spread(cfg(spread_transport="relay"), dict.fromkeys(names, "pull"))
    assert plan.lines() == [
        "image: peers (4 hosts lack it): node1 pulls; 3 host(s) get it from a peer; "
        "fetches: 1 (registry mode: 4)",
        "  node1 -> node2, node3",
        "  node2 -> node4",
        "  transport: relay (through cvs's own SSH connections)",
    ]
    assert plan.to_dict()["feeds"] == {"node1": ["node2", "node3"], "node2": ["node4"]}


def test_distribute_does_not_change_the_container_config_hash() -> None:
    from orchestrator.containers.labels import config_hash

    assert config_hash(cfg()) == config_hash(cfg(distribute="registry"))
    assert config_hash(cfg()) == config_hash(cfg(spread_transport="relay"))


def test_distribute_rejects_other_words() -> None:
    with pytest.raises(ValueError, match="distribute"):
        cfg(distribute="torrent")


# -- the direct hop: which edges go host to host ------------------------------

K = frozenset({"ssh-ed25519 AAAAkey"})


def test_plan_shows_the_direct_transport_by_default() -> None:
    plan = decide_spread(cfg(), dict.fromkeys(hosts(3), "pull"))
    assert plan.transport == "direct"
    assert plan.to_dict()["transport"] == "direct"
    assert plan.lines()[-1].startswith("  transport: direct (host to host over ssh")


def test_direct_split_takes_every_edge_whose_key_the_receiver_confirms() -> None:
    feeds = {"node1": ("node2", "node3"), "node2": ("node4",)}
    scanned = {e: K for e in [("node1", "node2"), ("node1", "node3"), ("node2", "node4")]}
    own = {h: K for h in ["node2", "node3", "node4"]}
    split = spread_plan.direct_split(feeds, scanned, own)
    assert dict(split.feeds) == feeds
    assert set(split.host_keys.values()) == {"ssh-ed25519 AAAAkey"}
    assert sorted(split.host_keys) == ["node2", "node3", "node4"]
    assert not split.relayed


def test_direct_split_relays_an_unreachable_receiver_and_its_subtree() -> None:
    feeds = {"node1": ("node2", "node3"), "node2": ("node4",)}
    scanned = {("node1", "node2"): None, ("node1", "node3"): K, ("node2", "node4"): K}
    own = {h: K for h in ["node2", "node3", "node4"]}
    split = spread_plan.direct_split(feeds, scanned, own)
    assert dict(split.feeds) == {"node1": ("node3",)}
    assert split.relayed["node2"] == "node1 cannot reach it (no sshd answer)"
    assert "node2" in split.relayed["node4"]


def test_direct_split_refuses_a_key_the_receiver_does_not_show_itself() -> None:
    feeds = {"node1": ("node2",)}
    other = frozenset({"ssh-ed25519 AAAAother"})
    split = spread_plan.direct_split(feeds, {("node1", "node2"): other}, {"node2": K})
    assert not split.feeds
    assert "host key" in split.relayed["node2"]


def test_direct_split_in_auto_an_unreachable_receiver_fetches_itself_its_subtree_is_relayed() -> (
    None
):
    feeds = {"node1": ("node2", "node3"), "node2": ("node4",)}
    scanned = {("node1", "node2"): None, ("node1", "node3"): K, ("node2", "node4"): K}
    own = {h: K for h in ["node2", "node3", "node4"]}
    split = spread_plan.direct_split(feeds, scanned, own, "registry")
    assert dict(split.feeds) == {"node1": ("node3",)}
    assert dict(split.fallback) == {"node2": "not reachable from node1 (no sshd answer)"}
    assert dict(split.relayed) == {"node4": "its feeder node2 gets the image on its own"}


def test_direct_split_in_auto_a_wrong_host_key_is_a_fallback_too() -> None:
    other = frozenset({"ssh-ed25519 AAAAother"})
    split = spread_plan.direct_split(
        {"node1": ("node2",)}, {("node1", "node2"): other}, {"node2": K}, "registry"
    )
    assert not split.feeds and not split.relayed
    assert "not reachable from node1 (the host key" in split.fallback["node2"]


@pytest.mark.parametrize(("distribute", "unreached"), [("auto", "registry"), ("peers", "relay")])
def test_spread_plan_auto_falls_back_to_the_registry_peers_relays(
    distribute: str, unreached: str
) -> None:
    plan = decide_spread(cfg(distribute=distribute), dict.fromkeys(hosts(3), "pull"))
    assert plan.unreached == unreached
    assert plan.to_dict()["unreached"] == unreached
    tail = plan.lines()[-1]
    assert ("cannot reach pulls itself" in tail) == (unreached == "registry"), tail
