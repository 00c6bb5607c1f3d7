"""The handshake admission window (pure logic): it grows while handshakes
complete in time, shrinks on a rising handshake time, halves on a timeout or a
reset while handshakes slow down, and
never acts twice on one round's news. The async gate admits first come, first
served, and only while the window has room."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.ssh.admission import AdmissionGate, AimdWindow, Outcome, slow_threshold


def complete(window: AimdWindow, outcome: Outcome, seconds: float = 0.05) -> None:
    ticket = window.admit()
    ticket.outcome = outcome
    window.finish(ticket, seconds)


def fill(window: AimdWindow) -> list[object]:
    tickets = []
    while window.can_admit():
        tickets.append(window.admit())
    return tickets


def test_slow_start_doubles_the_window_per_round_of_fast_handshakes() -> None:
    window = AimdWindow(connect_timeout=10, initial=8)
    tickets = fill(window)
    assert len(tickets) == 8
    for t in tickets:
        t.outcome = "ok"  # type: ignore[attr-defined]
        window.finish(t, 0.05)  # type: ignore[arg-type]
    assert window.window == 16


def slowing_down(window: AimdWindow) -> None:
    """Successful handshakes taking 2 s of a 10 s connect_timeout: not yet
    slow enough to act on (3.3 s), but past half of it."""
    window.smoothed = 2.0
    window.samples = 10
    window.fastest = 0.05


def test_a_timeout_while_handshakes_slow_down_halves_the_window_once_per_round() -> None:
    window = AimdWindow(connect_timeout=10, initial=64)
    slowing_down(window)
    tickets = fill(window)
    for t in tickets[:10]:  # ten handshakes of the same round time out
        t.outcome = "congested"  # type: ignore[attr-defined]
        window.finish(t, 10.0)  # type: ignore[arg-type]
    assert window.window == 32
    assert window.decreases == 1


def test_a_timeout_of_the_next_round_halves_it_again() -> None:
    window = AimdWindow(connect_timeout=10, initial=64)
    slowing_down(window)
    complete(window, "congested")
    slowing_down(window)
    complete(window, "congested")  # admitted after the decrease: new news
    assert window.window == 16


def test_dead_hosts_beside_fast_ones_do_not_shrink_the_window() -> None:
    # Half the fleet times out (hosts down, sshds hung), the other half
    # connects in 50 ms: our side is not overloaded, the window must not
    # drop to its minimum (5000 hosts x 10 s / 4 would take hours). A
    # 5000-host fleet's window (not the default 100 000): the rounds are as
    # many, each of them fleet-sized rather than a hundred thousand handshakes.
    window = AimdWindow(connect_timeout=10, initial=64, maximum=5000)
    for _ in range(20):
        tickets = fill(window)
        for n, t in enumerate(tickets):
            t.outcome = "congested" if n % 2 else "ok"  # type: ignore[attr-defined]
            window.finish(t, 10.0 if n % 2 else 0.05)  # type: ignore[arg-type]
    assert window.decreases == 0
    assert window.window >= 64


def test_the_window_never_drops_below_its_minimum() -> None:
    window = AimdWindow(connect_timeout=10, initial=8, minimum=4)
    for _ in range(10):
        slowing_down(window)
        complete(window, "congested")
    assert window.window == 4


def test_handshakes_slowing_past_a_third_of_connect_timeout_shrink_the_window() -> None:
    window = AimdWindow(connect_timeout=9, initial=32)
    # Far from timing out (9 s), but the coordinator is falling behind: 4 s each.
    complete(window, "ok", seconds=0.1)
    before = window.window
    complete(window, "ok", seconds=4.0)
    assert window.window == before  # one slow host is an outlier, not a trend
    for _ in range(30):
        complete(window, "ok", seconds=4.0)
        if window.decreases:
            break
    assert window.window == before * 0.75  # early news: a gentle decrease


def test_a_far_away_fleet_is_not_mistaken_for_a_loaded_coordinator() -> None:
    # Every handshake takes 3 s (a slow WAN) with connect_timeout 10: the
    # threshold follows the fastest handshake seen, and the window grows.
    assert slow_threshold(10, 3.0) == 9.0
    window = AimdWindow(connect_timeout=10, initial=4, maximum=5000)  # a 5000-host fleet
    for _ in range(20):
        tickets = fill(window)
        for t in tickets:
            t.outcome = "ok"  # type: ignore[attr-defined]
            window.finish(t, 3.0)  # type: ignore[arg-type]
    assert window.decreases == 0
    assert window.window > 100


def test_after_a_decrease_the_window_grows_by_one_per_round() -> None:
    window = AimdWindow(connect_timeout=10, initial=32)
    slowing_down(window)
    complete(window, "congested")
    assert window.window == 16
    tickets = fill(window)
    for t in tickets:
        t.outcome = "ok"  # type: ignore[attr-defined]
        window.finish(t, 0.05)  # type: ignore[arg-type]
    assert window.window == pytest.approx(17, abs=0.1)


def test_refused_and_cancelled_handshakes_say_nothing_about_load() -> None:
    window = AimdWindow(connect_timeout=10, initial=16)
    for _ in range(5):
        complete(window, "neutral", seconds=9.0)
    assert window.window == 16
    assert window.in_flight == 0


def test_an_idle_window_does_not_grow() -> None:
    window = AimdWindow(connect_timeout=10, initial=16)
    for _ in range(100):  # one handshake at a time: the window is never in use
        complete(window, "ok")
    assert window.window == 16


@given(
    st.lists(
        st.tuples(st.sampled_from(["ok", "congested", "neutral"]), st.floats(0, 20)),
        max_size=300,
    )
)
def test_the_window_stays_within_its_bounds_whatever_happens(
    events: list[tuple[Outcome, float]],
) -> None:
    window = AimdWindow(connect_timeout=10, initial=16, minimum=4, maximum=1000)
    open_tickets = []
    for outcome, seconds in events:
        if window.can_admit() and len(open_tickets) < 50:
            open_tickets.append(window.admit())
        else:
            t = open_tickets.pop(0)
            t.outcome = outcome
            window.finish(t, seconds)
        assert 4 <= window.window <= 1000
        assert window.in_flight == len(open_tickets)


def test_the_gate_admits_only_what_the_window_allows_first_come_first_served() -> None:
    gate = AdmissionGate(AimdWindow(connect_timeout=10, initial=4, minimum=4))
    order: list[int] = []
    in_slot = 0
    peak = 0

    async def one(i: int) -> None:
        nonlocal in_slot, peak
        async with gate.slot() as ticket:
            order.append(i)
            in_slot += 1
            peak = max(peak, in_slot)
            await anyio.sleep(0.01)
            in_slot -= 1
            ticket.outcome = "neutral"

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
                await anyio.sleep(0)  # start in order

    anyio.run(main)
    assert peak == 4
    assert order == list(range(20))
    assert gate.window.in_flight == 0


def test_a_handshake_cancelled_while_queued_leaves_no_trace() -> None:
    gate = AdmissionGate(AimdWindow(connect_timeout=10, initial=4, minimum=4))

    async def hold() -> None:
        async with gate.slot():
            await anyio.sleep(0.2)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(hold)
            await anyio.sleep(0.01)
            with anyio.move_on_after(0.05):
                async with gate.slot():
                    raise AssertionError("admitted beyond the window")
            assert gate.waiting == 0

    anyio.run(main)
    assert gate.window.in_flight == 0
