"""The direct hop of an image spread: feeder to receiver over the hosts' own ssh.

    split = await DirectHop(pool, runtimes, image, budget, run_id).probe(feeds, endpoints)
    broken = await DirectHop(...).run(split, feeds_parent, endpoints)

Transport `direct` (`container.spread_transport`): the bytes of an edge
feeder -> receiver leave the feeder on its own ssh client into the
receiver's sshd, not through cvs (containers/spread.py's relay, which
costs cvs's link one copy per receiver). It uses only what the hosts have:
their sshd, the ssh client (cvs reaches them over SSH) and the runtime.

Per receiver cvs makes an ed25519 key in memory, for this invocation only.
Its public half goes into the receiver's login user's authorized_keys,
usable only from the feeder's address and only to run the receiver's part
(`from="ADDR",restrict,command="sh DIR/fan.sh DIR"`, tagged with this
invocation's id); its private half goes to the feeder on the stdin of its
lease (never argv) into a 0600 file, with a known_hosts holding only the
receiver's host key: the key the feeder saw at the receiver's address and
the receiver's own sshd showed to the receiver itself (over cvs's verified
connection), else the edge is not direct. Every host of the round holds a
lease (remote/spread_lease.sh): a shell on cvs's connection that removes
the line and the files when its stdin closes (cvs let go, failed, was
interrupted or killed: its connection closes), on a signal, or after the
round's bound. The streams are remote/spread_fan.sh's.

Before the round every edge is probed (remote/spread_reach.sh: the feeder's
ssh-keyscan of the receiver, bounded): the pure decision is
spread_plan.direct_split; an edge that fails it goes through cvs instead
(with distribute `auto`: its receiver runs its own pull or load), said and
named by the caller. cvs sees no byte of a direct edge: the image
ID check after the load (the caller's) is what accepts a host.

Progress and the stall cut: each receiver's lease, told `watch`, reports
the read count of its fan's tee once a second (remote/spread_lease.sh);
the counts become the caller's progress events, and a receiver whose count
stands still for `stall` seconds once bytes flowed is told `cut` (its fan
ends; the caller feeds it and its subtree again). The round ends when the
sources' fans have ended and every receiver that reports has ended or
been cut: a receiver under a relay that died silently is not left waiting
for the round's budget.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from orchestrator import remote
from orchestrator.containers.spread_plan import DirectSplit, Unreached, direct_split
from orchestrator.errors import ConnectError
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.seam import HeldRequest, HostRunner

# (address, sshd port) a peer reaches a host at.
Endpoint = tuple[str, int]

# ssh-keyscan's bound per peer, seconds.
PROBE_TIMEOUT = 5
# A lease outlives the round's own bound by this much at most.
LEASE_MARGIN = 60.0
_KEY = re.compile(r"@@cvs:key (\S+) (\d+) (\S+) (\S+)")
_READY = re.compile(r"@@cvs:ready (/[A-Za-z0-9/._-]+) ([A-Za-z0-9._-]+)")
_BYTES = re.compile(r"@@cvs:bytes (\d+)")
# A receiver's tee has read this much once bytes flow (below: the loader's
# own reads of the tee's libraries): the stall bound runs from then on.
FLOWING = 64 * 1024
# (receiving host, bytes more, its feeder): the caller's progress.
Progress = Callable[[str, int, str], None]


class _SetupError(Exception):
    pass


class DirectHop:
    def __init__(
        self,
        pool: HostRunner,
        runtimes: Mapping[str, ContainerRuntime],
        cmds: Mapping[str, tuple[list[str], list[str]]],
        *,
        timeout: float,
        budget: float,
        run_id: str,
        stall: float | None = None,
        progress: Progress | None = None,
    ) -> None:
        # cmds: host -> (its save argv, its load argv)
        self.pool, self.runtimes, self.cmds = pool, runtimes, cmds
        self.timeout, self.budget, self.run_id = timeout, budget, run_id
        # Once bytes flow, a receiver whose count stands still this long is cut.
        self.stall = stall if stall is not None else timeout
        self.progress = progress
        self._held: dict[str, Any] = {}  # host -> its lease

    # -- the probe -----------------------------------------------------------

    async def _keys(self, host: str, targets: Sequence[Endpoint]) -> dict[Endpoint, frozenset[str]]:
        args = [str(PROBE_TIMEOUT)] + [x for a, p in targets for x in (a, str(p))]
        bound = PROBE_TIMEOUT * (len(targets) + 1) + self.timeout
        r = await self.pool.run(
            host, remote.argv("spread_reach", *args), timeout=bound, stream_output=False,
            label="reach",
        )  # fmt: skip
        seen: dict[Endpoint, set[str]] = {}
        for m in _KEY.finditer(r.stdout if r.ok else ""):
            seen.setdefault((m[1], int(m[2])), set()).add(f"{m[3]} {m[4]}")
        return {e: frozenset(k) for e, k in seen.items()}

    async def probe(
        self,
        feeds: Mapping[str, tuple[str, ...]],
        endpoints: Mapping[str, Endpoint],
        unreached: Unreached = "relay",
    ) -> DirectSplit:
        """Every edge: does the feeder reach the receiver's sshd, with a host
        key the receiver confirms (one bounded round trip per host)."""
        receivers = [k for kids in feeds.values() for k in kids]
        feeders = list(feeds)
        seen = await fan_out(feeders, lambda f: self._keys(f, [endpoints[k] for k in feeds[f]]))
        own = await fan_out(receivers, lambda r: self._keys(r, [endpoints[r]]))
        scanned = {(f, k): seen[f].get(endpoints[k]) for f, kids in feeds.items() for k in kids}
        confirmed = {r: own[r].get(endpoints[r], frozenset()) for r in receivers}
        return direct_split(feeds, scanned, confirmed, unreached)

    # -- the round -----------------------------------------------------------

    async def run(self, split: DirectSplit, endpoints: Mapping[str, Endpoint]) -> dict[str, str]:
        """The direct streams down `split.feeds`, all at once, within the
        budget: receiver -> why it surely got nothing (the rest is for the
        image ID check to judge)."""
        feeds = split.feeds
        receivers = [k for kids in feeds.values() for k in kids]
        sources = [f for f in feeds if f not in receivers]
        broken: dict[str, str] = {}
        async with contextlib.AsyncExitStack() as stack:
            try:
                with anyio.fail_after(self.timeout * 2):
                    ready = await self._leases(stack, split, endpoints, [*sources, *receivers])
            except (TimeoutError, _SetupError, ConnectError, OSError, asyncssh.Error) as exc:
                why = f"the direct hop could not be set up: {exc or 'no answer'}"
                return dict.fromkeys(receivers, why)
            for kid in receivers:
                with contextlib.suppress(OSError, asyncssh.Error):
                    self._held[kid].stdin.write("watch\n")
            await self._stream(sources, ready, feeds, broken, stack)
        return broken

    async def _leases(
        self,
        stack: contextlib.AsyncExitStack,
        split: DirectSplit,
        endpoints: Mapping[str, Endpoint],
        hosts: Sequence[str],
    ) -> dict[str, tuple[str, str]]:
        """A lease on every host of the round, the receivers' keys
        authorized, the feeders' keys and known_hosts in place: host ->
        (its lease's directory, its login user)."""
        feeds = split.feeds
        parent = {k: f for f, kids in feeds.items() for k in kids}
        keys = {r: asyncssh.generate_private_key("ssh-ed25519") for r in parent}
        limit = f"{self.budget + LEASE_MARGIN:.0f}"
        leases: dict[str, Any] = {}
        for host in hosts:
            argv = remote.argv("spread_lease", self.run_id, limit)
            leases[host] = await stack.enter_async_context(
                self.pool.held_process(host, HeldRequest(argv))
            )
        self._held = leases
        for host, lease in leases.items():
            lines = self._setup_lines(host, host in parent)
            if host in parent:
                pub = keys[host].export_public_key("openssh").decode().split()
                lines += [f"w pub {pub[0]} {pub[1]}", f"auth {endpoints[parent[host]][0]}"]
            lease.stdin.write("\n".join([*lines, "go"]) + "\n")
        ready: dict[str, tuple[str, str]] = {}
        for host, lease in leases.items():
            m = _READY.fullmatch((await lease.stdout.readline()).strip())
            if m is None:
                raise _SetupError(f"{host}: the spread's lease did not start")
            ready[host] = (m[1], m[2])
        for feeder, kids in feeds.items():
            lines = []
            for n, kid in enumerate(kids):
                private = keys[kid].export_private_key("openssh").decode()
                lines += [f"w key.{n} {x}" for x in private.splitlines()]
                address, port = endpoints[kid]
                pattern = address if port == 22 else f"[{address}]:{port}"
                lines.append(f"w known_hosts {pattern} {split.host_keys[kid]}")
                lines.append(f"w kids {n} {ready[kid][1]} {address} {port}")
            leases[feeder].stdin.write("\n".join([*lines, "sync"]) + "\n")
        for feeder in feeds:
            if (await leases[feeder].stdout.readline()).strip() != "@@cvs:synced":
                raise _SetupError(f"{feeder}: the spread's lease refused its keys")
        return ready

    def _setup_lines(self, host: str, receiving: bool) -> list[str]:
        save, load = self.cmds[host]
        lines = [f"w cmd {a}" for a in (load if receiving else save)]
        if not receiving and self.runtimes[host].drains_a_cut_save:
            lines.append("w drain 1")
        return lines + [f"w fan.sh {x}" for x in remote.program("spread_fan").splitlines()]

    async def _stream(
        self,
        sources: Sequence[str],
        ready: Mapping[str, tuple[str, str]],
        feeds: Mapping[str, tuple[str, ...]],
        broken: dict[str, str],
        stack: contextlib.AsyncExitStack,
    ) -> None:
        """Each source's `fan.sh send`; it ends when its whole subtree has."""
        procs: dict[str, Any] = {}
        for src in sources:
            d = ready[src][0]
            try:
                procs[src] = await stack.enter_async_context(
                    self.pool.held_process(src, HeldRequest(["sh", f"{d}/fan.sh", d, "send"]))
                )
            except (ConnectError, OSError, asyncssh.Error) as exc:
                for kid in feeds[src]:
                    broken[kid] = f"its feeder {src} could not start: {exc}"
                continue
            stack.callback(_terminate, procs[src])
        parent = {k: f for f, kids in feeds.items() for k in kids}
        with anyio.move_on_after(self.budget) as scope:
            async with anyio.create_task_group() as tg:
                watch = _Watch(parent, self.stall, self.progress)
                for kid in parent:
                    tg.start_soon(watch.read, kid, self._held[kid])
                tg.start_soon(self._cut_stalled, watch, broken)
                for proc in procs.values():
                    with contextlib.suppress(OSError, asyncssh.Error):
                        await proc.stderr.read()
                        await proc.wait()
                # The sources' fans end with their own children's ssh: a
                # receiver under a relay that died may still be waiting on
                # a connection that will say nothing more. Every receiver
                # that reports its count ends, or is cut after `stall`.
                watch.sources_done = True
                while watch.open():
                    await anyio.sleep(0.2)
                tg.cancel_scope.cancel()
        if scope.cancelled_caught:
            for src in procs:
                for kid in feeds[src]:
                    broken.setdefault(kid, f"the transfer did not finish within {self.budget:g}s")

    async def _cut_stalled(self, watch: _Watch, broken: dict[str, str]) -> None:
        """Once a second: a receiver whose bytes stopped for `stall` seconds
        is cut (its lease TERMs its fan: its load fails on the cut archive,
        its own children's streams end) and named; the caller's second
        round feeds it, and them, from a host that has the image."""
        while True:
            await anyio.sleep(1.0)
            for kid in watch.stalled(time.monotonic()):
                broken[kid] = (
                    f"its feeder {watch.parent[kid]} stalled: no byte for {self.stall:g}s (cut)"
                )
                with contextlib.suppress(OSError, asyncssh.Error):
                    self._held[kid].stdin.write("cut\n")


class _Watch:
    """The receivers' byte counts as their leases report them."""

    def __init__(self, parent: Mapping[str, str], stall: float, progress: Progress | None) -> None:
        self.parent, self.stall, self.progress = parent, stall, progress
        self.count = dict.fromkeys(parent, 0)
        self.moved: dict[str, float] = {}  # host -> when its count last changed
        self.ended: set[str] = set()
        self.cut: set[str] = set()
        # The sources' streams ended: any receiver still open is an orphan,
        # cut after `stall` however few bytes it had.
        self.sources_done = False

    def open(self) -> list[str]:
        """Receivers that report their count and have neither ended nor been cut."""
        return [h for h in self.moved if h not in self.ended and h not in self.cut]

    async def read(self, host: str, lease: Any) -> None:
        with contextlib.suppress(OSError, asyncssh.Error):
            async for line in lease.stdout:
                m = _BYTES.fullmatch(line.strip())
                if m is not None:
                    n = int(m[1])
                    if self.progress is not None and n > self.count[host]:
                        self.progress(host, n - self.count[host], self.parent[host])
                    self.count[host] = n
                    self.moved[host] = time.monotonic()
                elif line.strip() == "@@cvs:end":
                    self.ended.add(host)
                    return

    def stalled(self, now: float) -> list[str]:
        """Receivers to cut now: bytes flowed, then none for `stall` seconds."""
        out = [
            h
            for h, t in self.moved.items()
            if h not in self.ended
            and h not in self.cut
            and (self.count[h] > FLOWING or self.sources_done)
            and now - t >= self.stall
        ]
        self.cut.update(out)
        return out


def _terminate(proc: Any) -> None:
    if getattr(proc, "exit_status", None) is not None:
        return
    with contextlib.suppress(OSError, asyncssh.Error, AttributeError):
        proc.send_signal("TERM")
