"""PURE: how the image reaches the hosts that lack it (`container.distribute`).

    spread = decide_spread(cfg, image_steps, states)

`registry`: every host lacking the image runs its own image step (a pull,
or a load of `image_tar`), as before: the registry (or the shared
filesystem) serves N x S bytes. `peers`: one host gets the image once (the
seed: a host that already has the tag, else the first host lacking it,
which pulls or loads), and every other one gets it from a host that has it,
pipelined: each receiver loads the bytes while passing them on to the hosts
it feeds (containers/spread.py moves them). `auto`: peers when two or more
hosts lack the image, else registry.

The shape is a tree in host order: the seed feeds the first K receivers,
each of them the next K, and so on, K = ceil(sqrt(N)) (at least 2). Why
that K: the bytes travel through the coordinator's SSH connections (see
spread.py), so every receiver costs the coordinator one stream out whatever
the shape, and every feeder one stream in: sqrt(N) feeders keep what the
coordinator reads small while the depth (hops a byte takes, each adding a
host's load latency) stays at 2 for any N up to K^2.

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
from orchestrator.containers.probe import HostState

Mode = Literal["peers", "registry"]
ImageStep = Literal["pull", "load"] | None

# `docker load` unpacks into the runtime's root before it commits the layers
# (../shared/DESIGN.md, "Runtimes"): a receiver needs about twice the image.
SPACE_FACTOR = 2.0


@dataclass(frozen=True)
class SpreadPlan:
    mode: Mode
    why: str  # one line: why this mode
    # The host that fetches (pull / load of image_tar) or already has the image;
    # None in registry mode.
    seed: str | None = None
    seed_fetches: bool = False  # the seed runs its image step first (else it has the tag)
    # Who feeds whom: feeder -> the hosts it passes the bytes to, in order.
    feeds: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    receivers: tuple[str, ...] = ()  # the hosts that get the image from a peer
    # Times the registry (or image_tar's filesystem) serves the whole image.
    registry_fetches: int = 0
    # What every host would have fetched with `registry`: the saving, for the plan.
    registry_fetches_without: int = 0
    source: Literal["registry", "image_tar", "host"] = "registry"

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
            "seed_fetches": self.seed_fetches,
            "source": self.source,
            "feeds": {f: list(c) for f, c in self.feeds.items()},
            "registry_fetches": self.registry_fetches,
            "registry_fetches_without": self.registry_fetches_without,
        }

    def lines(self) -> list[str]:
        """What `cvs plan` prints (and `up` says before it moves a byte)."""
        if not self.peers:
            return [f"image: {self.mode} ({self.why}); fetches: {self.registry_fetches}"]
        where = {"registry": "pulls", "image_tar": "loads image_tar", "host": "has the image"}
        seed = f"{self.seed} {where[self.source] if self.seed_fetches else where['host']}"
        out = [
            f"image: peers ({self.why}): {seed}; {len(self.receivers)} host(s) get it from a "
            f"peer; fetches: {self.registry_fetches} (registry mode: "
            f"{self.registry_fetches_without})"
        ]
        out += [f"  {feeder} -> {', '.join(kids)}" for feeder, kids in self.feeds.items()]
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


def decide_spread(
    cfg: ContainerConfig,
    image_steps: Mapping[str, ImageStep],
    states: Mapping[str, HostState],
) -> SpreadPlan:
    """The spread for the launching hosts (`image_steps`: host -> its plan's
    image step, in host order; None where the tag is there already)."""
    needing = [h for h, step in image_steps.items() if step is not None]
    source: Literal["registry", "image_tar", "host"] = (
        "image_tar" if cfg.image_tar is not None and cfg.pull != "always" else "registry"
    )
    every = len(needing)
    if cfg.distribute == "registry":
        why = "container.distribute: registry"
        return SpreadPlan("registry", why, registry_fetches=every, source=source)
    # A host with the tag already can seed without any fetch, unless the tag
    # must be fetched again (pull: always).
    having = [
        h
        for h, s in states.items()
        if h not in needing
        and s.known
        and s.tag_image_id is not None
        and cfg.pull != "always"
        and h in image_steps
    ]
    receivers_if_seeded = len(needing) if having else len(needing) - 1
    if receivers_if_seeded < 1 or (cfg.distribute == "auto" and every < 2):
        why = "no host lacks the image" if every == 0 else "only one host lacks the image"
        return SpreadPlan("registry", why, registry_fetches=every, source=source)
    why = "container.distribute: peers" if cfg.distribute == "peers" else f"{every} hosts lack it"
    if having:
        seed, receivers, fetches, seed_fetches = having[0], needing, 0, False
    else:
        seed, receivers, fetches, seed_fetches = needing[0], needing[1:], 1, True
    return SpreadPlan(
        "peers",
        why,
        seed,
        seed_fetches,
        MappingProxyType(tree(seed, receivers)),
        tuple(receivers),
        registry_fetches=fetches,
        registry_fetches_without=every,
        source=source if seed_fetches else "host",
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
