"""Moving an image from the hosts that have it to the hosts that lack it.

    result = await Spread(pool, sink, cfg, runtimes, spread).run(image_id, size)

containers/spread_plan.py decides the shape (who feeds whom); this module
moves the bytes. Each feeder's archive stream (`docker save NAME:TAG` on a
host that has the image, or the relayed stream of a receiver that feeds
others) is read over that host's existing SSH connection and written into
`docker load` on each host it feeds (remote/spread_load.sh, which also
passes the bytes on while loading them when that host feeds others). All
streams of a round run at once: the image is pipelined down the tree.

Two transports (`container.spread_transport`). `direct`, the default: the
edges whose hosts reach each other go host to host
(containers/spread_direct.py: a key for this invocation, held by leases;
each receiver reports its own byte count, and one whose count stands still
is cut), because the coordinator's link would otherwise carry every hop.
`relay` (and, with `direct`, every edge that fails the probe under
distribute `peers`, the subtree of one that fails it under `auto`, whose
receiver fetches itself instead, and whatever that round did not
deliver): the bytes come through here, which needs nothing new on any
host (no listener, no key, no port, no file), so nothing can be left
behind by a SIGKILL of cvs: when cvs dies its SSH
channels close, the loads read a cut archive and tag nothing, the saves
lose their reader (measured against direct in docs/distribution.md).

Checks: before any byte moves, every receiver's free space in the runtime's
root is read and a host short of about twice the image is named and left
out (spread_plan.space_shortfalls). After the load, every receiver's tag
must resolve to the image ID the seed has (the config digest the registry
or image_tar named): a host whose load failed or whose ID differs is named,
its wrong tag removed, and it is fed again from a host that has the image;
what still fails falls back to its own pull or load (the caller's).

Faults: a feeder that dies ends its children's stream (their loads fail and
they are fed again from another host); one that stalls (no byte for
`stall` seconds once bytes flowed) is cut off the same way; a child that
stops reading is dropped after `stall` seconds without holding up its
siblings. Ctrl-C or any exit: every remote process of the round gets TERM
(remote/spread_load.sh and spread_send.sh end their process groups) and its channel closes.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio

from orchestrator import remote
from orchestrator.config import ContainerConfig
from orchestrator.containers.argv import validate_image_ref
from orchestrator.containers.inspection import normalize_image_id
from orchestrator.containers.spread_direct import DirectHop, Endpoint
from orchestrator.containers.spread_plan import SpreadPlan, refeed, space_shortfalls, tree
from orchestrator.errors import ConnectError
from orchestrator.events import EventSink, ImageProgress, Message
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.seam import HeldRequest, HostRunner

CHUNK = 256 * 1024
# Progress events: at most one a second per host.
PROGRESS_EVERY = 1.0

# (receiving host, chunk, offset of the chunk in the stream) -> the bytes
# sent. Tests set it to corrupt one hop; None in use.
Mangle = Callable[[str, bytes, int], bytes]
# (receiving host, its load argv) -> the argv its direct hop runs. Tests set
# it to corrupt one direct hop (cvs sees none of its bytes); None in use.
DirectLoad = Callable[[str, list[str]], list[str]]


@dataclass
class SpreadResult:
    got: dict[str, str] = field(default_factory=dict)  # host -> verified image ID
    failed: dict[str, str] = field(default_factory=dict)  # host -> why (fetch it yourself)
    short: dict[str, str] = field(default_factory=dict)  # host -> not enough space (not fed)
    # host -> why its feeder cannot reach it (distribute `auto`): its own pull or load.
    fallback: dict[str, str] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)  # feeder -> bytes it passed on


class _Progress:
    """Bytes done per receiver; an ImageProgress at most once a second each."""

    def __init__(self, sink: EventSink, total: int, hosts: Sequence[str]) -> None:
        self.sink, self.total = sink, total
        self.start = time.monotonic()
        self.done = dict.fromkeys(hosts, 0)
        self.last: dict[str, float] = {}

    def drop(self, host: str) -> None:
        """`host` gets no bytes from a peer (it fetches itself): the ETA waits not for it."""
        self.done.pop(host, None)

    def add(self, host: str, n: int, source: str) -> None:
        before = self.done.get(host, 0)
        self.done[host] = before + n
        now = time.monotonic()
        # Once a second, and once more when the total is reached: an archive
        # is larger than the image's size, so the bytes past it are throttled too.
        reached = before < self.total <= self.done[host]
        if now - self.last.get(host, 0.0) < PROGRESS_EVERY and not reached:
            return
        self.last[host] = now
        elapsed = max(now - self.start, 1e-6)
        rate = self.done[host] / elapsed
        # The fleet's ETA: the slowest receiver's remaining bytes at its rate.
        etas = [
            max(self.total - d, 0) * elapsed / d for d in self.done.values() if d > 0 and self.total
        ]
        eta = max(etas) if etas and len(etas) == len(self.done) else None
        self.sink.emit(
            ImageProgress(
                host=host, done=self.done[host], total=self.total, rate=rate, eta=eta, source=source
            )
        )


class Spread:
    # Tests corrupt one hop through this (tests/test_spread_sandbox.py).
    mangle: ClassVar[Mangle | None] = None
    direct_load: ClassVar[DirectLoad | None] = None

    def __init__(
        self,
        pool: HostRunner,
        sink: EventSink,
        cfg: ContainerConfig,
        runtimes: Mapping[str, ContainerRuntime],
        plan: SpreadPlan,
        *,
        stall: float | None = None,
        budget: float | None = None,
        endpoints: Mapping[str, Endpoint] | None = None,
        on_fallback: Callable[[str], object] | None = None,
    ) -> None:
        self.pool, self.sink, self.cfg, self.plan = pool, sink, cfg, plan
        # Told each receiver that fetches itself (result.fallback) once the
        # probe knows: its pull need not wait for the spread.
        self.on_fallback = on_fallback
        # Where peers reach each host's sshd: the `direct` transport needs it.
        self.endpoints = endpoints
        self.runtimes = runtimes
        self.image = validate_image_ref(cfg.image)
        # Once bytes flow, a feeder silent this long is cut off (a docker call's bound).
        self.stall = stall if stall is not None else cfg.runtime_timeout
        # The whole round, first byte included (`docker save` writes the image
        # to a temp dir before its first byte): what a start may take.
        self.budget = budget if budget is not None else cfg.start_timeout

    # -- the round trips ---------------------------------------------------

    async def free_space(self, hosts: Sequence[str]) -> dict[str, int | None]:
        async def one(host: str) -> int | None:
            rt = self.runtimes[host]
            argv = remote.argv("spread_space", *rt.prefix, *rt.root_dir_args)
            r = await self.pool.run(
                host, argv, timeout=self.cfg.runtime_timeout, stream_output=False, label="space"
            )
            text = r.stdout.strip()
            return int(text) if r.ok and text.isdigit() else None

        return await fan_out(list(hosts), one)

    async def image_id(self, host: str) -> str | None:
        rt = self.runtimes[host]
        argv = [*rt.prefix, "image", "inspect", "-f", "{{.Id}}", self.image]
        r = await self.pool.run(
            host, argv, timeout=self.cfg.runtime_timeout, stream_output=False, label="image"
        )
        text = r.stdout.strip()
        return normalize_image_id(text) if r.ok and text else None

    async def _untag(self, host: str) -> None:
        """A tag that resolves to the wrong image goes (the image with it
        when nothing else names it): it must not be used, nor look present."""
        argv = [*self.runtimes[host].prefix, "rmi", self.image]
        await self.pool.run(
            host, argv, timeout=self.cfg.runtime_timeout, stream_output=False, label="rmi"
        )

    # -- the spread ---------------------------------------------------------

    async def run(self, expected_id: str, size: int) -> SpreadResult:
        plan, result = self.plan, SpreadResult()
        receivers = list(plan.receivers)
        seed = plan.seed or ""
        free = await self.free_space(receivers)
        result.short = space_shortfalls(size, free)
        for host, why in result.short.items():
            self.sink.emit(Message(level="error", host=host, text=f"not enough space: {why}"))
        receivers = [h for h in receivers if h not in result.short]
        if not receivers:
            return result
        progress = _Progress(self.sink, size, receivers)
        feeds = tree(seed, receivers) if result.short else dict(plan.feeds)
        if plan.transport == "direct" and self.endpoints is not None:
            broken, dead = await self._direct(feeds, progress, result), set[str]()
            receivers = [h for h in receivers if h not in result.fallback]
        else:
            broken, dead = await self._round(feeds, progress, result)
        await self._verify(receivers, expected_id, result, broken)
        again = [h for h in receivers if h in broken and h not in dead]
        if again:
            have = [seed, *result.got]
            for host in again:
                self.sink.emit(
                    Message(
                        level="warning",
                        host=host,
                        text=f"image not received: {broken[host]}; fed again from a host that "
                        "has it",
                    )
                )
            retry: dict[str, str] = {}
            await self._round(refeed(plan, have, again, sorted(dead)), progress, result, retry)
            await self._verify(again, expected_id, result, retry)
            broken = {**{h: w for h, w in broken.items() if h not in again}, **retry}
        result.failed = {h: w for h, w in broken.items() if h not in result.got}
        return result

    async def _direct(
        self, feeds: Mapping[str, tuple[str, ...]], progress: _Progress, result: SpreadResult
    ) -> dict[str, str]:
        """The direct transport (containers/spread_direct.py) on every edge
        whose hosts reach each other: receiver -> why it is not served that
        way (the retry round feeds it through cvs). With distribute `auto`, a
        receiver its feeder cannot reach goes to result.fallback instead (its
        own pull or load; the caller runs it)."""
        assert self.endpoints is not None
        tamper = Spread.direct_load
        cmds = {
            h: (
                [*self.runtimes[h].prefix, "save", *self.runtimes[h].archive_args, self.image],
                tamper(h, [*rt.prefix, "load"]) if tamper else [*rt.prefix, "load"],
            )
            for h in {*feeds, *(k for kids in feeds.values() for k in kids)}
            for rt in [self.runtimes[h]]
        }
        hop = DirectHop(
            self.pool, self.runtimes, cmds, timeout=self.cfg.runtime_timeout, budget=self.budget,
            run_id=secrets.token_hex(6), stall=self.stall, progress=progress.add,
        )  # fmt: skip
        split = await hop.probe(feeds, self.endpoints, self.plan.unreached)
        fetch = "pulls from the registry" if self.plan.source == "registry" else "loads image_tar"
        for host, why in split.fallback.items():
            result.fallback[host] = why
            progress.drop(host)
            self.sink.emit(Message(level="warning", host=host, text=f"{why}: {fetch} itself"))
            if self.on_fallback is not None:
                self.on_fallback(host)
        for host, why in split.relayed.items():
            text = f"not reached host to host: {why}; it gets the image through cvs"
            self.sink.emit(Message(level="warning", host=host, text=text))
        broken = dict(split.relayed)
        if split.feeds:
            broken.update(await hop.run(split, self.endpoints))
        return broken

    async def _verify(
        self, hosts: Sequence[str], expected: str, result: SpreadResult, broken: dict[str, str]
    ) -> None:
        """Every receiver whose load succeeded: its tag resolves to `expected`."""

        async def one(host: str) -> None:
            if host in broken:
                return
            got = await self.image_id(host)
            if got == expected:
                result.got[host] = got
                return
            if got is not None:
                await self._untag(host)
            broken[host] = (
                f"the loaded image is {got[:19]}, not {expected[:19]} (refused, removed)"
                if got
                else f"{self.image} not present after the load"
            )
            self.sink.emit(Message(level="warning", host=host, text=broken[host]))

        await fan_out(list(hosts), one)

    def _send_argv(self, host: str) -> list[str]:
        rt = self.runtimes[host]
        drain = "1" if rt.drains_a_cut_save else "0"
        return remote.argv("spread_send", drain, *rt.prefix, "save", *rt.archive_args, self.image)

    def _load_argv(self, host: str, forward: bool) -> list[str]:
        rt = self.runtimes[host]
        return remote.argv("spread_load", "1" if forward else "0", *rt.prefix, "load")

    async def _round(
        self,
        feeds: Mapping[str, tuple[str, ...]],
        progress: _Progress,
        result: SpreadResult,
        broken: dict[str, str] | None = None,
    ) -> tuple[dict[str, str], set[str]]:
        """One round of streams down `feeds` (feeder -> children), all at once:
        (receiver -> why its image did not arrive, feeders that died)."""
        broken = {} if broken is None else broken
        dead: set[str] = set()
        receivers = [c for kids in feeds.values() for c in kids]
        sources = [f for f in feeds if f not in receivers]
        procs: dict[str, Any] = {}
        async with contextlib.AsyncExitStack() as stack:
            for host in [*sources, *receivers]:
                command = (
                    self._send_argv(host)
                    if host in sources
                    else self._load_argv(host, bool(feeds.get(host)))
                )
                try:
                    procs[host] = await stack.enter_async_context(
                        self.pool.held_process(host, HeldRequest(command, encoding=None))
                    )
                except (ConnectError, OSError, asyncssh.Error) as exc:
                    broken[host] = f"could not start the transfer: {exc}"
                    dead.add(host)
                    continue
                stack.callback(_terminate, procs[host])  # runs first on exit: TERM, then close
            with anyio.move_on_after(self.budget) as scope:
                async with anyio.create_task_group() as tg:
                    for feeder, kids in feeds.items():
                        tg.start_soon(self._pump, feeder, procs, kids, progress, result, broken)
                for host in receivers:
                    if host in procs and host not in broken:
                        await self._finish(host, procs[host], broken)
            if scope.cancelled_caught:
                for host in receivers:
                    broken.setdefault(host, f"the transfer did not finish within {self.budget:g}s")
        for feeder, kids in feeds.items():
            if feeder in broken:
                # A relay whose own load failed may still have passed every byte
                # on: its children were judged by their own loads above.
                for kid in kids:
                    broken.setdefault(kid, f"its feeder {feeder} failed: {broken[feeder]}")
        return broken, dead

    async def _finish(self, host: str, proc: Any, broken: dict[str, str]) -> None:
        """A receiver's load: its exit status once its stream ended."""
        try:
            err = (await proc.stderr.read()).decode("utf-8", "replace").strip()
            done = await proc.wait()
        except (OSError, asyncssh.Error) as exc:
            broken[host] = f"connection lost: {exc}"
            return
        if done.exit_status != 0:
            last = err.splitlines()[-1] if err else f"exit code {done.exit_status}"
            broken[host] = f"load failed (refused): {last}"
            self.sink.emit(Message(level="warning", host=host, text=broken[host]))

    async def _pump(
        self,
        feeder: str,
        procs: Mapping[str, Any],
        kids: Sequence[str],
        progress: _Progress,
        result: SpreadResult,
        broken: dict[str, str],
    ) -> None:
        """`feeder`'s stream into each of `kids`, chunk by chunk, until it ends;
        a kid that stops reading is dropped, the others go on."""
        live = {k: procs[k] for k in kids if k in procs and k not in broken}
        src = procs.get(feeder)
        if src is None:
            for k, proc in live.items():
                broken[k] = f"its feeder {feeder} could not be reached"
                _terminate(proc)
            return
        offset = 0
        try:
            while live:
                # The first byte may wait for the whole `docker save` (the budget bounds it).
                wait = self.stall if offset else self.budget
                with anyio.fail_after(wait):
                    chunk = await src.stdout.read(CHUNK)
                if not chunk:
                    break
                await self._deliver(feeder, chunk, offset, live, broken, progress)
                offset += len(chunk)
                result.sent[feeder] = result.sent.get(feeder, 0) + len(chunk) * len(live)
        except TimeoutError:
            for kid, proc in live.items():
                broken[kid] = f"its feeder {feeder} stalled: no byte for {self.stall:g}s"
                _terminate(proc)
            live = {}
        except (OSError, asyncssh.Error) as exc:
            for kid, proc in live.items():
                broken[kid] = f"its feeder {feeder} was lost: {exc}"
                _terminate(proc)
            live = {}
        for proc in live.values():
            with contextlib.suppress(OSError, asyncssh.Error):
                proc.stdin.write_eof()

    async def _deliver(
        self,
        feeder: str,
        chunk: bytes,
        offset: int,
        live: dict[str, Any],
        broken: dict[str, str],
        progress: _Progress,
    ) -> None:
        """One chunk into every live kid; one that does not take it within
        `stall` seconds (or whose channel is gone) is dropped from `live`."""
        mangle = Spread.mangle
        for kid, proc in list(live.items()):
            data = mangle(kid, chunk, offset) if mangle is not None else chunk
            try:
                proc.stdin.write(data)
                with anyio.fail_after(self.stall):
                    await proc.stdin.drain()
            except (TimeoutError, OSError, asyncssh.Error) as exc:
                why = "stopped reading" if isinstance(exc, TimeoutError) else str(exc)
                broken[kid] = f"receiving from {feeder}: {why}"
                _terminate(live.pop(kid))
                continue
            progress.add(kid, len(chunk), feeder)


def _terminate(proc: Any) -> None:
    """TERM the remote process group (spread_*.sh end all of it) unless it
    has exited; then its channel may close."""
    if getattr(proc, "exit_status", None) is not None:
        return
    with contextlib.suppress(OSError, asyncssh.Error, AttributeError):
        proc.send_signal("TERM")


async def image_size(
    pool: HostRunner, cfg: ContainerConfig, host: str, rt: ContainerRuntime
) -> int:
    """The image's size on `host` in bytes (what `save` streams, about); 0: unreadable."""
    argv = [*rt.prefix, "image", "inspect", "-f", "{{.Size}}", validate_image_ref(cfg.image)]
    r = await pool.run(host, argv, timeout=cfg.runtime_timeout, stream_output=False, label="image")
    text = r.stdout.strip()
    return int(text) if r.ok and text.isdigit() else 0


# What the lifecycle hands over: its own prepare of one host (the plan's
# image step, or none with `fetched`: the image ID a peer's bytes gave it),
# returning the tag's image ID (None: a step failed); and how to fail a
# host before anything moved to it.
Prepare = Callable[[str, "str | None"], Awaitable[str | None]]
Fail = Callable[[str, str], None]
Received = Callable[[str, str, float], None]


async def spread_and_prepare(
    pool: HostRunner,
    sink: EventSink,
    cfg: ContainerConfig,
    plan: SpreadPlan,
    launching: Sequence[str],
    runtimes: Mapping[str, ContainerRuntime],
    *,
    prepare: Prepare,
    fail: Fail,
    received: Received,
    forks: int | None = None,
    endpoints: Mapping[str, Endpoint] | None = None,
) -> SpreadResult | None:
    """The launching hosts' image steps with a spread: the seed's first,
    then the spread to the receivers while the hosts that need nothing
    prepare; a receiver the spread could not serve runs its own image step
    (the registry or image_tar: another source; with distribute `auto`, one
    its feeder cannot reach starts it as soon as the probe says so, while
    the spread goes on), one short of space fails
    before anything moved to it. None: the seed's fetch failed, and no other
    host fetches (a start goes everywhere or nowhere: the caller holds them
    back, naming the seed)."""
    for line in plan.lines():
        sink.emit(Message(level="info", text=line))
    seed = plan.seed or ""
    rest = [h for h in launching if h != seed and h not in plan.receivers]

    async def own(host: str) -> None:
        await prepare(host, None)

    expected = await prepare(seed, None)
    if expected is None:
        return None
    result = SpreadResult()
    async with anyio.create_task_group() as tg:
        if rest:

            async def others() -> None:
                await fan_out(rest, own, limit=forks)

            tg.start_soon(others)
        start = time.monotonic()
        size = await image_size(pool, cfg, seed, runtimes[seed])
        limiter = anyio.CapacityLimiter(forks or math.inf)

        async def fetch_itself(host: str) -> None:
            async with limiter:
                await own(host)

        spread = Spread(
            pool, sink, cfg, runtimes, plan, endpoints=endpoints,
            on_fallback=lambda host: tg.start_soon(fetch_itself, host),
        )  # fmt: skip
        result = await spread.run(expected, size)
        for host in result.got:
            received(host, plan.parent(host) or seed, time.monotonic() - start)
    for host, why in result.short.items():
        fail(host, f"not enough space, nothing moved: {why}")
    for host, why in result.failed.items():
        text = f"image not received from a peer ({why}): it runs its own pull or load"
        sink.emit(Message(level="warning", host=host, text=text))
    done = [h for h in plan.receivers if h in result.got]

    async def peer(host: str) -> None:
        await prepare(host, result.got[host])

    await fan_out(done, peer, limit=forks)
    await fan_out(list(result.failed), own, limit=forks)
    return result
