"""PURE: how the image reaches the hosts that lack it (`container.distribute`).

    spread = decide_spread(cfg, image_steps)

`registry`: every host lacking the image runs its own image step (a pull,
or a load of `image_tar`), as before: the registry (or the shared
filesystem) serves N x S bytes. `peers`: one host gets the image once (the
seed: the first host lacking it, which pulls or loads as it would alone),
and every other one lacking it gets it from a host that has it,
pipelined: each receiver loads the bytes while passing them on to the hosts
it feeds (containers/spread.py moves them). `auto`: peers when two or more
hosts lack the image (and they can reach each other: a receiver its feeder
cannot reach host to host runs its own pull or load, see direct_split),
else registry.

The shape is a tree in host order: the seed feeds the first K receivers,
each of them the next K, and so on, K = ceil(sqrt(N)) (at least 2). Why
that K: the bytes travel through the coordinator's SSH connections (see
spread.py), so every receiver costs the coordinator one stream out whatever
the shape, and every feeder one stream in: sqrt(N) feeders keep what the
coordinator reads small while the depth (hops a byte takes, each adding a
host's load latency) stays at 2 for any N up to K^2.

With `container.spread_transport: direct` (the default), direct_split
decides per edge, from the reachability probe's facts, which edges go host
to host; the same K then bounds what one feeder's own link carries (K
copies), and the depth stays 2.

Everything here is a function of probed facts and the config, so `cvs plan`
shows the spread `up` then does (the same call, in Lifecycle.decide_for).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from orchestrator.config import ContainerConfig

Mode = Literal["peers", "registry"]
ImageStep = Literal["pull", "load"] | None
Transport = Literal["relay", "direct"]
# What a receiver its feeder cannot reach host to host gets: the bytes
# through cvs (`relay`), or its own pull or load (`registry`).
Unreached = Literal["relay", "registry"]

# `docker load` unpacks into the runtime's root before it commits the layers
# (../shared/DESIGN.md, "Runtimes"): a receiver needs about twice the image.
SPACE_FACTOR = 2.0


@dataclass(frozen=True)
class SpreadPlan:
    mode: Mode
    why: str  # one line: why this mode
    # The host that fetches (pull / load of image_tar) first; None in registry mode.
    seed: str | None = None
    # Who feeds whom: feeder -> the hosts it passes the bytes to, in order.
    feeds: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    receivers: tuple[str, ...] = ()  # the hosts that get the image from a peer
    # Times the registry (or image_tar's filesystem) serves the whole image.
    registry_fetches: int = 0
    # What every host would have fetched with `registry`: the saving, for the plan.
    registry_fetches_without: int = 0
    source: Literal["registry", "image_tar"] = "registry"
    # How the bytes move (`container.spread_transport`); `direct` edges are
    # decided per edge by a probe before the spread (direct_split).
    transport: Transport = "relay"
    # `auto`: a receiver its feeder cannot reach pulls (or loads image_tar)
    # itself, as the auto asks; an explicit `peers` relays it.
    unreached: Unreached = "relay"

    @property
    def peers(self) -> bool:
        return self.mode == "peers" and bool(self.receivers)

    def parent(self, host: str) -> str | None:
        for feeder, children in self.feeds.items():
            if host in children:
                return feeder
        return None

    def to_dict(self) -> dict[str, object]:
        """The spread for `cvs plan --json`."""
        return {
            "mode": self.mode,
            "why": self.why,
            "seed": self.seed,
            "source": self.source,
            "feeds": {f: list(c) for f, c in self.feeds.items()},
            "registry_fetches": self.registry_fetches,
            "registry_fetches_without": self.registry_fetches_without,
            "transport": self.transport,
            "unreached": self.unreached,
        }

    def lines(self) -> list[str]:
        """What `cvs plan` prints (and `up` says before it moves a byte)."""
        if not self.peers:
            return [f"image: {self.mode} ({self.why}); fetches: {self.registry_fetches}"]
        seed = f"{self.seed} {'pulls' if self.source == 'registry' else 'loads image_tar'}"
        out = [
            f"image: peers ({self.why}): {seed}; {len(self.receivers)} host(s) get it from a "
            f"peer; fetches: {self.registry_fetches} (registry mode: "
            f"{self.registry_fetches_without})"
        ]
        out += [f"  {feeder} -> {', '.join(kids)}" for feeder, kids in self.feeds.items()]
        fetch = "pulls" if self.source == "registry" else "loads image_tar"
        out.append(
            "  transport: relay (through cvs's own SSH connections)"
            if self.transport != "direct"
            else "  transport: direct (host to host over ssh; a receiver its feeder cannot "
            f"reach {fetch} itself)"
            if self.unreached == "registry"
            else "  transport: direct (host to host over ssh; an edge whose hosts cannot reach "
            "each other goes through cvs)"
        )
        return out


def fan_out_degree(n: int) -> int:
    """K, the hosts one feeder passes the bytes to, for N receivers (see above)."""
    return max(2, math.ceil(math.sqrt(max(n, 1))))


def tree(seed: str, receivers: Sequence[str], k: int | None = None) -> dict[str, tuple[str, ...]]:
    """The seed feeds receivers[0:K], receivers[i] feeds the K after the
    previous feeder's (breadth first, in host order)."""
    k = k or fan_out_degree(len(receivers))
    nodes = [seed, *receivers]
    feeds: dict[str, list[str]] = {}
    for j in range(1, len(nodes)):
        feeds.setdefault(nodes[(j - 1) // k], []).append(nodes[j])
    return {f: tuple(c) for f, c in feeds.items()}


def decide_spread(cfg: ContainerConfig, image_steps: Mapping[str, ImageStep]) -> SpreadPlan:
    """The spread for the launching hosts (`image_steps`: host -> its plan's
    image step, in host order; None where the tag is there already)."""
    needing = [h for h, step in image_steps.items() if step is not None]
    source: Literal["registry", "image_tar"] = (
        "image_tar" if cfg.image_tar is not None and cfg.pull != "always" else "registry"
    )
    every = len(needing)
    if cfg.distribute == "registry":
        why = "container.distribute: registry"
        return SpreadPlan("registry", why, registry_fetches=every, source=source)
    # The seed always fetches, even where another host has the tag already:
    # the receivers must end with the image the registry (or image_tar) names,
    # and a host's older tag stays subject to the skew check (the barrier).
    if every < 2:
        why = "no host lacks the image" if every == 0 else "only one host lacks the image"
        return SpreadPlan("registry", why, registry_fetches=every, source=source)
    why = "container.distribute: peers" if cfg.distribute == "peers" else f"{every} hosts lack it"
    seed, receivers = needing[0], needing[1:]
    return SpreadPlan(
        "peers",
        why,
        seed,
        MappingProxyType(tree(seed, receivers)),
        tuple(receivers),
        registry_fetches=1,
        registry_fetches_without=every,
        source=source,
        transport=cfg.spread_transport,
        unreached="registry" if cfg.distribute == "auto" else "relay",
    )


def space_shortfalls(
    image_size: int, free: Mapping[str, int | None], factor: float = SPACE_FACTOR
) -> dict[str, str]:
    """host -> why it cannot take the image (None free: not readable, not refused)."""
    need = int(image_size * factor)
    return {
        h: f"{_gib(f)} free where the image needs {_gib(need)} ({factor:g} x {_gib(image_size)}: "
        "the image and its unpacking): free space in the runtime's root directory"
        for h, f in free.items()
        if f is not None and f < need
    }


def _gib(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def refeed(
    plan: SpreadPlan, have: Sequence[str], failed: Sequence[str], dead: Sequence[str] = ()
) -> dict[str, tuple[str, ...]]:
    """A second round for receivers whose stream broke (a relay died or
    stalled, bytes refused): each is fed by a host that has the image now,
    round robin over them, the seed first; `dead` hosts feed no one."""
    feeders = [h for h in dict.fromkeys([plan.seed or "", *have]) if h and h not in dead]
    if not feeders:
        return {}
    out: dict[str, list[str]] = {}
    for i, host in enumerate(failed):
        out.setdefault(feeders[i % len(feeders)], []).append(host)
    return {f: tuple(c) for f, c in out.items()}


# -- the direct hop (transport `direct`) ------------------------------------


@dataclass(frozen=True)
class DirectSplit:
    """Which edges of a spread carry the bytes host to host."""

    # feeder -> children over the feeder's own ssh: every edge whose receiver
    # the feeder reached and whose host key the receiver itself confirmed.
    feeds: Mapping[str, tuple[str, ...]]
    # receiver -> the known_hosts key (`TYPE BASE64`) its feeder accepts.
    host_keys: Mapping[str, str]
    # receiver -> why not direct (it, and those under it, go through the coordinator).
    relayed: Mapping[str, str]
    # With `unreached="registry"`: receiver -> why its feeder cannot reach it
    # ("not reachable from node1 (no sshd answer)"): it runs its own pull or
    # load; those under it are in `relayed` (fed through cvs by a host that
    # has the image, after the round).
    fallback: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def direct_split(
    feeds: Mapping[str, tuple[str, ...]],
    scanned: Mapping[tuple[str, str], frozenset[str] | None],
    own: Mapping[str, frozenset[str]],
    unreached: Unreached = "relay",
) -> DirectSplit:
    """The direct part of `feeds` from probed facts: `scanned[(feeder,
    receiver)]` the host keys the feeder saw at the receiver's sshd (None: no
    answer within the bound, or the probe failed), `own[receiver]` the keys
    the receiver's sshd shows to the receiver itself (through the
    coordinator's verified connection). An edge is direct when the feeder
    reached the receiver and saw a key the receiver confirms; a receiver
    under a relayed one is relayed too (its feeder never gets the bytes
    directly), and is fed by the coordinator from a host that has them.
    With `unreached="registry"` (distribute `auto`) a receiver whose own
    edge fails is in `fallback` instead (its own pull or load); its
    subtree is relayed as above."""
    out: dict[str, list[str]] = {}
    keys: dict[str, str] = {}
    relayed: dict[str, str] = {}
    fallback: dict[str, str] = {}
    receivers = {kid for kids in feeds.values() for kid in kids}
    sources = [f for f in feeds if f not in receivers]
    order = list(sources)
    for feeder in order:  # breadth first: a feeder's own fate is known first
        for kid in feeds.get(feeder, ()):
            order.append(kid)
            seen = scanned.get((feeder, kid))
            confirmed = sorted(seen & own.get(kid, frozenset())) if seen else []
            if feeder in fallback:
                relayed[kid] = f"its feeder {feeder} gets the image on its own"
            elif feeder in relayed:
                relayed[kid] = f"its feeder {feeder} is fed through the coordinator"
            elif seen is None or not confirmed:
                why = (
                    "no sshd answer"
                    if seen is None
                    else f"the host key {feeder} sees is not the one it shows itself"
                )
                if unreached == "registry":
                    fallback[kid] = f"not reachable from {feeder} ({why})"
                elif seen is None:
                    relayed[kid] = f"{feeder} cannot reach it ({why})"
                else:
                    relayed[kid] = why
            else:
                out.setdefault(feeder, []).append(kid)
                keys[kid] = confirmed[0]
    return DirectSplit(
        MappingProxyType({f: tuple(c) for f, c in out.items()}),
        MappingProxyType(keys),
        MappingProxyType(relayed),
        MappingProxyType(fallback),
    )
