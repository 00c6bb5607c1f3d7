"""Admission control for SSH handshakes: how many are in flight adapts to what
the coordinator completes, as TCP's congestion window adapts to the network.

Why: a handshake costs CPU on our side (key exchange, signatures) and on the
server's. Started all at once (`--forks` at the fleet size), thousands of them
share one core; each takes longer than `connect_timeout`, times out, is
retried, and the retries add to the load: congestion collapse. A fixed cap the
user must guess is either too small for a fast network or too big for a
loaded coordinator.

`AimdWindow` is the decision, pure and synchronous (tested without IO):

- slow start: from `initial` (64) in flight, +1 per handshake that completed
  in time, so the window doubles per round while handshakes stay fast;
- congestion avoidance after the first signal: +1/window per on-time
  completion (+1 per round);
- the smoothed time of the handshakes that succeed (EWMA, as TCP's srtt)
  rising above `slow_after` (`slow_threshold`: a third of connect_timeout,
  or 3x the fastest handshake seen if that is longer, so a far-away fleet is
  not mistaken for a loaded coordinator) shrinks the window to 3/4, gently,
  as a delay signal is early news (TCP Vegas); a handshake that timed out or
  was reset while the successful ones are slowing down too (past half that
  threshold) halves it, a loss. Never below `minimum`. Timeouts alone,
  beside fast successes, are dead hosts, not our load: a fleet with many of
  them must not shrink to `minimum` and take hours;
- at most one decrease per round: outcomes of handshakes admitted before the
  last decrease are ignored (they were admitted under the old window);
- the window grows only while it is in use (at least half full at some
  admission during the handshake's life), so an idle pool does not build up a
  window it has never tested.

`AdmissionGate` is the IO side: a FIFO of waiting handshakes admitted while
`in_flight < window`. Time spent waiting here is not a handshake's time: the
caller starts its `connect_timeout` once admitted.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

import anyio

Outcome = Literal["ok", "congested", "neutral"]

# The EWMA weight of a new sample (TCP's alpha for srtt).
SMOOTHING = 1 / 8
# Handshakes the smoothed time must cover before it is acted on.
MIN_SAMPLES = 4


def slow_threshold(connect_timeout: float, fastest: float | None) -> float:
    """Smoothed handshake time beyond which the coordinator counts as congested:
    a third of connect_timeout (room for the slowest of a round, which take
    longer than the mean, to finish in time), or 3x the fastest seen."""
    third = connect_timeout / 3
    if fastest is None:
        return third
    return max(third, 3 * fastest)


@dataclass
class Ticket:
    """One admitted handshake: its place in the admission order."""

    seq: int
    admitted_at: float = field(default_factory=time.monotonic)
    outcome: Outcome = "neutral"


@dataclass
class AimdWindow:
    """Additive increase, multiplicative decrease of handshakes in flight."""

    connect_timeout: float
    initial: float = 64
    minimum: float = 4
    maximum: float = 100_000
    window: float = 0.0
    ssthresh: float = float("inf")
    in_flight: int = 0
    smoothed: float | None = None  # EWMA of handshake seconds since the last decrease
    samples: int = 0  # how many went into it
    fastest: float | None = None
    decreases: int = 0
    _seq: int = 0
    _recovery: int = 0  # tickets with seq <= this were admitted before the last decrease
    _busy: int = 0  # the last admission that found the window at least half full

    def __post_init__(self) -> None:
        if self.window <= 0:
            self.window = self.initial

    def can_admit(self) -> bool:
        return self.in_flight < max(1, int(self.window))

    def admit(self) -> Ticket:
        self._seq += 1
        self.in_flight += 1
        if self.in_flight >= self.window / 2:
            self._busy = self._seq
        return Ticket(self._seq)

    def finish(self, ticket: Ticket, seconds: float) -> None:
        """A handshake left the window; `ticket.outcome` says how it went."""
        self.in_flight -= 1
        if ticket.outcome == "neutral":
            return  # refused, cancelled: says nothing about our load
        if ticket.outcome == "ok":
            self.samples += 1
            self.smoothed = (
                seconds
                if self.smoothed is None
                else (1 - SMOOTHING) * self.smoothed + SMOOTHING * seconds
            )
            self.fastest = seconds if self.fastest is None else min(self.fastest, seconds)
        if ticket.seq <= self._recovery:
            return  # admitted under the old window: its news is already acted on
        # A trend, not one host: judged on a few handshakes at least.
        known = self.smoothed is not None and self.samples >= MIN_SAMPLES
        slow = known and self.smoothed is not None and self.smoothed > self.slow_after()
        slowing = known and self.smoothed is not None and self.smoothed > self.slow_after() / 2
        if ticket.outcome == "congested" and slowing:
            self._decrease(0.5)
        elif slow:
            self._decrease(0.75)
        elif self._busy >= ticket.seq:  # the window was in use during its life
            self._increase()

    def slow_after(self) -> float:
        return slow_threshold(self.connect_timeout, self.fastest)

    def _increase(self) -> None:
        if self.window < self.ssthresh:
            self.window += 1
        else:
            self.window += 1 / self.window
        self.window = min(self.window, self.maximum)

    def _decrease(self, factor: float) -> None:
        self.ssthresh = max(self.minimum, self.window * factor)
        self.window = self.ssthresh
        self._recovery = self._seq
        self.decreases += 1
        # The smoothed time carried the overload just acted on; the next round
        # is judged on its own handshakes.
        self.smoothed = None
        self.samples = 0


@dataclass
class _Waiter:
    """A handshake waiting to be admitted; `ticket` is set when it is."""

    event: anyio.Event = field(default_factory=anyio.Event)
    ticket: Ticket | None = None


class AdmissionGate:
    """Handshakes wait here, first come first served, until the window admits them."""

    def __init__(self, window: AimdWindow) -> None:
        self.window = window
        self._waiters: deque[_Waiter] = deque()
        self.peak_in_flight = 0
        self.admitted = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _wake(self) -> None:
        while self._waiters and self.window.can_admit():
            waiter = self._waiters.popleft()
            waiter.ticket = self._admit()
            waiter.event.set()

    def _admit(self) -> Ticket:
        ticket = self.window.admit()
        self.admitted += 1
        self.peak_in_flight = max(self.peak_in_flight, self.window.in_flight)
        return ticket

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Ticket]:
        """Wait for admission, then hold a place in the window for the block.
        Set `ticket.outcome` in the block; cancelled or unset counts as neutral."""
        if not self._waiters and self.window.can_admit():
            ticket = self._admit()
        else:
            waiter = _Waiter()
            self._waiters.append(waiter)
            try:
                await waiter.event.wait()
            except BaseException:
                if waiter.ticket is None:
                    self._waiters.remove(waiter)
                else:  # admitted just as we were cancelled: give the place back
                    self.window.finish(waiter.ticket, 0.0)
                    self._wake()
                raise
            assert waiter.ticket is not None
            ticket = waiter.ticket
        ticket.admitted_at = time.monotonic()
        try:
            yield ticket
        finally:
            self.window.finish(ticket, time.monotonic() - ticket.admitted_at)
            self._wake()
