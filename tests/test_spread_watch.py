"""When a direct edge is cut (containers/spread_direct.py's _Watch): pure
logic over the counts the receivers' leases report."""

from __future__ import annotations

from orchestrator.containers.spread import _Progress
from orchestrator.containers.spread_direct import FLOWING, _Watch
from orchestrator.events import CollectingSink, ImageProgress


def watch() -> _Watch:
    return _Watch({"node2": "node1", "node4": "node2"}, stall=10.0, progress=None)


def test_a_count_standing_still_past_the_bound_is_cut_once_bytes_flowed() -> None:
    w = watch()
    w.count.update(node2=FLOWING + 1, node4=FLOWING // 2)
    w.moved.update(node2=0.0, node4=0.0)
    assert w.stalled(9.9) == []
    # node4 only had the tee's own start: the first byte may take a while.
    assert w.stalled(10.0) == ["node2"]
    assert w.stalled(20.0) == []  # cut once


def test_after_the_sources_ended_an_orphan_is_cut_however_few_its_bytes() -> None:
    w = watch()
    w.count.update(node2=FLOWING + 1, node4=100)
    w.moved.update(node2=0.0, node4=0.0)
    w.ended.add("node2")
    w.sources_done = True
    assert w.open() == ["node4"]
    assert w.stalled(10.0) == ["node4"]
    assert w.open() == []


def test_a_receiver_that_never_reported_is_not_waited_for() -> None:
    w = watch()
    w.sources_done = True
    assert w.open() == [] and w.stalled(100.0) == []


def test_bytes_past_the_total_are_throttled_after_one_event_at_the_total() -> None:
    # An archive is larger than the image's size: what passes the total is
    # still at most once a second (it was an event per chunk).
    sink = CollectingSink()
    progress = _Progress(sink, total=1000, hosts=["node2"])
    progress.add("node2", 100, "node1")  # the first: said
    for _ in range(9):
        progress.add("node2", 100, "node1")  # within the second; the last reaches 1000
    for _ in range(40):
        progress.add("node2", 256, "node1")  # past the total, within the second
    said = [e for e in sink.events if isinstance(e, ImageProgress)]
    assert [e.done for e in said] == [100, 1000]
