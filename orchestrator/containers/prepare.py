"""`up`'s prepare step on each launching host, before the barrier: the
plan's image step (login, load or pull, within one start budget) or the
image a spread gave the host, what the tag resolves to, the configured
devices present there and, where the probe did not list them, the host's
GPUs.

    preparer = Preparer(steps)
    prepared = await preparer.prepare(host, state, outcome)
    await preparer.spread(plan.spread, launching, states, outcomes, prepare)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.containers.argv import image_inspect_argv, load_argv, login_command, pull_argv
from orchestrator.containers.inspection import parse_image_inspect
from orchestrator.containers.outcome import HostOutcome
from orchestrator.containers.probe import HostState
from orchestrator.containers.pull_progress import PullProgress
from orchestrator.containers.spread import Prepare, spread_and_prepare
from orchestrator.containers.spread_plan import SpreadPlan
from orchestrator.containers.steps import Steps
from orchestrator.containers.timeouts import StartBudget
from orchestrator.limits.cdi import SpecFile, spec_files
from orchestrator.limits.gpus import GPU, discovery_argv, parse_discovery
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult


@dataclass
class Prepared:
    """What the prepare step found on a launching host."""

    tag_image_id: str | None = None
    tag_repo_digests: tuple[str, ...] = ()
    devices: list[str] = field(default_factory=list)  # configured devices present here
    # Only where the probe did not list the GPUs (the plan then could not
    # choose them): what `up` listed itself, for the same `choose_gpus`.
    gpus: list[GPU] | None = None
    cdi_specs: list[SpecFile] = field(default_factory=list)
    runtime_version: str | None = None  # asked only where CDI depends on it


class Preparer:
    """The prepare step of one `up`'s launching hosts."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.cluster = steps.cluster
        self.cfg = steps.cfg
        self._pulls: PullProgress | None = None  # the pulling hosts' progress

    async def prepare(
        self, host: str, state: HostState, outcome: HostOutcome, peer_image: str | None = None
    ) -> Prepared:
        """The plan's image step (login, load or pull); the tag's image; the
        configured devices present on the host; and, where the probe did not
        list them, the host's GPUs. `peer_image`: the image ID a spread gave
        the host (checked there): no image step."""
        action = outcome.action
        tag_id, digests = state.tag_image_id, state.tag_repo_digests
        if peer_image is not None:
            tag_id, digests = peer_image, ()
        elif action.image_step is not None:
            fetched = await self._fetch_image(state.runtime.prefix, outcome)
            if fetched is None:
                return Prepared()
            tag_id, digests = fetched
        prepared = Prepared(tag_id, digests, await self._present_devices(outcome))
        if self.cfg.gpus is not None and action.gpus is None and outcome.ok:
            await self._list_gpus(host, state, outcome, prepared)
        return prepared

    async def _fetch_image(
        self, prefix: list[str], outcome: HostOutcome
    ) -> tuple[str | None, tuple[str, ...]] | None:
        """The plan's image step, within one start budget however many round
        trips; then what the tag resolves to (None: a step failed)."""
        cfg, action, cmd = self.cfg, outcome.action, self.steps.cmd
        steps = [*(["login"] if action.login else []), action.image_step or "pull"]
        budget = StartBudget(cfg.start_timeout, " and ".join(steps))
        if action.login and cfg.registry is not None:
            login = login_command(
                prefix, cfg.registry, cfg.image, tls_verify=cfg.registry_tls_verify
            )
            if await cmd(outcome, "login", login, budget=budget) is None:
                return None
        if action.image_step == "load" and cfg.image_tar is not None:
            r = await cmd(outcome, "load", load_argv(prefix, cfg.image_tar), budget=budget)
        else:
            rt = ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)
            watch = PullProgress.for_pool(self.steps.pool, self.steps.sink, rt, cfg.image)
            if watch is not None:
                self._pulls = watch = self._pulls or watch  # one fleet ETA
            argv = pull_argv(prefix, cfg.image, tls_verify=cfg.registry_tls_verify)
            r = await cmd(outcome, "pull", argv, budget=budget, watch=watch)
        if r is None:
            return None
        r = await cmd(outcome, "image", image_inspect_argv(prefix, cfg.image))
        if r is None:
            return None
        info = parse_image_inspect(r.stdout)
        return info.id, tuple(info.repo_digests)

    async def _list_gpus(
        self, host: str, state: HostState, outcome: HostOutcome, prepared: Prepared
    ) -> None:
        """The host's GPUs and CDI specs (and, where CDI depends on it, the
        runtime's version) where the probe did not list them."""
        root = self.cluster.host(host).gpu_device_root or "/"
        r = await self.steps.cmd(
            outcome, "gpus", discovery_argv(root), timeout=self.cluster.ssh.command_timeout
        )
        if r is None:
            return
        prepared.gpus = parse_discovery(r.stdout)
        prepared.cdi_specs = spec_files(r.stdout)
        if self.cfg.cdi == "always" and state.runtime.cdi_since is not None:
            argv = [*state.runtime.prefix, "version", "--format", "{{.Server.Version}}"]
            v = await self.steps.cmd(outcome, "version", argv)
            prepared.runtime_version = v.stdout.strip() if v is not None else None

    async def _present_devices(self, outcome: HostOutcome) -> list[str]:
        """The configured `devices` that exist on this host (`/dev/infiniband/*` expanded)."""
        if not self.cfg.devices:
            return []
        paths = [d.split(":", 1)[0] for d in self.cfg.devices]
        script = 'for p in "$@"; do for f in $p; do [ -e "$f" ] && echo "$f"; done; done; true'
        r = await self.steps.cmd(
            outcome,
            "devices",
            ["sh", "-c", script, "sh", *paths],
            timeout=self.cluster.ssh.command_timeout,
        )
        if r is None:
            return []
        present = set(r.stdout.split())
        out: list[str] = []
        for spec, path in zip(self.cfg.devices, paths, strict=True):
            if "*" in path:
                out += sorted(p for p in present if fnmatch.fnmatchcase(p, path))
            elif path in present:
                out.append(spec)
        return out

    async def spread(
        self,
        spread: SpreadPlan,
        launching: Sequence[str],
        states: Mapping[str, HostState],
        outcomes: Mapping[str, HostOutcome],
        prepare: Prepare,
    ) -> None:
        """The launching hosts' image from one fetch, host to host (containers/spread.py)."""

        def fail(host: str, why: str) -> None:
            outcomes[host].fail("spread", None, why)
            self.steps.step(host, "spread", "failed", why)

        def received(host: str, feeder: str, seconds: float) -> None:
            said = f"from {feeder}, image ID checked"
            done = HostResult(host, "ok", exit_code=0, stdout=said, duration=seconds)
            outcomes[host].steps.append(("spread", done))
            self.steps.step(host, "spread", "ok", said)

        hosts = [spread.seed or "", *spread.receivers]
        runtimes = {h: states[h].runtime for h in hosts if h in states}
        # Where a peer reaches each host's sshd: where cvs itself does (transport `direct`).
        specs = {h: self.cluster.host(h) for h in hosts if h}
        ssh_port = self.cluster.ssh.port
        endpoints = {h: (s.address or s.name, s.port or ssh_port) for h, s in specs.items()}
        await spread_and_prepare(
            self.steps.pool,
            self.steps.sink,
            self.cfg,
            spread,
            launching,
            runtimes,
            prepare=prepare,
            fail=fail,
            received=received,
            forks=self.steps.forks,
            endpoints=endpoints,
        )
