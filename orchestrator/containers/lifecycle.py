"""Executing the container lifecycle: lock + probe, plan, per-host pipelines.

`up` takes, per host, a lock on the host and probes it in the same round
trip (the lock is held by the probing process until we are done), decides a
`Plan` with the pure `decide_plan`, then runs each host's pipeline on its own:

    prepare (login, load | pull, image id, devices, GPUs)   per host  prepare.py
    -- barrier: the tag resolves to one image everywhere; GPU requests fit --  barrier.py
    [remove] -> run -> provision -> sshd -> verify           per host  pipeline.py

The barrier is the one place all hosts must agree before anything starts;
no other step waits for the fleet. Each step runs through steps.py; what
the probe asks is probe_request.py's; a failed start is undone by
rollback.py; the peers' sshd are checked by peer_check.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from orchestrator.config import (
    ClusterConfig,
    ContainerConfig,
    caps_warnings,
    cluster_identity,
    container_name,
    deprecation_warnings,
    sshd_wanted,
)
from orchestrator.containers import mpi
from orchestrator.containers.barrier import barrier, gpu_counts
from orchestrator.containers.down import only_started_by, remove_all
from orchestrator.containers.drift import limits_drift
from orchestrator.containers.invocation import Invocation
from orchestrator.containers.jobend import JOB_LIFETIMES
from orchestrator.containers.labels import config_hash
from orchestrator.containers.locks import HostLocks, Mode, host_locks
from orchestrator.containers.outcome import HostOutcome, UpReport, run_failed
from orchestrator.containers.peer_check import check_peers
from orchestrator.containers.pipeline import HostPipeline
from orchestrator.containers.plan.down import decide_down
from orchestrator.containers.plan.facts import with_host_facts
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.plan.model import Plan
from orchestrator.containers.prepare import Prepared, Preparer
from orchestrator.containers.probe import HostState, parse_probe_output
from orchestrator.containers.probe_request import probe_request
from orchestrator.containers.provision import SetupScript
from orchestrator.containers.rollback import roll_back
from orchestrator.containers.slurm_tie import tie_launches
from orchestrator.containers.spread_plan import decide_spread
from orchestrator.containers.steps import Steps
from orchestrator.containers.subset import deciding, healed, narrowed, unread
from orchestrator.containers.timeouts import runtime_gave_up
from orchestrator.errors import PolicyRefused, UsageError
from orchestrator.events import EventSink, Message
from orchestrator.limits.resources import clamp_warnings, cluster_effective_resources
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.keys import ClusterKeys, default_state_dir
from orchestrator.ssh.seam import HostRunner


class Lifecycle:
    """The container lifecycle of one cluster over a `HostRunner` (an open `SSHPool`)."""

    def __init__(
        self,
        cluster: ClusterConfig,
        pool: HostRunner,
        sink: EventSink,
        *,
        locks: HostLocks | None = None,
        invocation: Invocation | None = None,
    ) -> None:
        if cluster.container is None:
            raise ValueError("the cluster file has no `container` block")
        self.cluster = cluster
        self.cfg: ContainerConfig = cluster.container
        self.pool = pool
        self.sink = sink
        self.name = container_name(cluster)
        self.identity = cluster_identity(cluster)
        self.hash = config_hash(self.cfg)
        self._script: SetupScript | None = None
        # This invocation's id and probed facts (containers/invocation.py).
        self.facts = invocation or Invocation()
        self.invocation = self.facts.id
        self.purpose = "up"  # what other invocations waiting on our locks are told
        # GPUs per host as the last `up` gave them (the hostfile's slots).
        self.gpu_counts: dict[str, int] = {}
        self.locks = locks or host_locks(cluster, pool, sink, self.facts)

    @property
    def steps(self) -> Steps:
        """What `up`'s steps run through (steps.py), as the cluster, pool and
        sink are now."""
        return Steps(self.cluster, self.cfg, self.name, self.pool, self.sink)

    @property
    def forks(self) -> int:
        """How many hosts `up` and `down` act on at once (steps.py)."""
        return self.steps.forks

    # -- probing --------------------------------------------------------

    def _probe_argv(self, host: str) -> list[str]:
        return probe_request(self.cluster, self.cfg, self.name, host)

    async def probe(self, host: str) -> HostState:
        """One round trip: what is on the host now."""
        result = await self.pool.run(
            host,
            self._probe_argv(host),
            timeout=self.cfg.runtime_timeout,
            stream_output=False,
            label="probe",
        )
        if not result.reached:
            return HostState.unreachable(host, str(result.error or result.status))
        if result.status == "timeout":
            return HostState.hung(host, runtime_gave_up(self.cfg, "the probe"))
        return parse_probe_output(host, result.exit_code or 0, result.stdout, result.stderr)

    async def probe_all(self, hosts: Sequence[str] | None = None) -> dict[str, HostState]:
        return await fan_out(list(hosts or self._hosts()), self.probe)

    def _hosts(self) -> list[str]:
        return [h.name for h in self.cluster.hosts]

    async def lock_and_probe(
        self,
        mode: Mode,
        *,
        wait: bool = True,
        purpose: str = "up",
        hosts: Sequence[str] | None = None,
    ) -> dict[str, HostState]:
        """Every host (or `hosts`) locked in `mode` and probed under the lock, in
        one round trip when no other invocation holds a conflicting lock
        (locks.py). A host whose docker does not answer within
        `container.runtime_timeout` comes back hung (state unknown), unlocked."""
        answers = await self.locks.acquire(
            list(hosts or self._hosts()),
            mode,
            wait=wait,
            probe=self._probe_argv,
            purpose=purpose,
        )
        self.facts.probed({h: a.state for h, a in answers.items() if a.state is not None})
        return {
            h: a.state or HostState.unreachable(h, a.error or a.status) for h, a in answers.items()
        }

    # -- deciding -------------------------------------------------------

    def script(self) -> SetupScript:
        if self._script is None:
            self._script = SetupScript.for_config(self.cfg)
        return self._script

    def decide(
        self,
        states: Mapping[str, HostState],
        *,
        force: bool = False,
        reprovision: bool = False,
        adopt: bool = False,
    ) -> Plan:
        if adopt and self.cfg.lifetime != "persistent":
            raise UsageError(
                f"adopt takes over running containers for lifetime persistent; this cluster's "
                f"lifetime is {self.cfg.lifetime}"
            )
        return decide_plan(
            self.cfg,
            states,
            force=force,
            reprovision=reprovision,
            script_sha256=self.script().sha256,
            config_hash=self.hash,
            adopt=adopt,
            cluster_name=self.identity,
            resources=cluster_effective_resources(self.cluster),
            slurm=self.cluster.slurm,
        )

    # -- acting ---------------------------------------------------------

    async def up(
        self,
        *,
        force: bool = False,
        reprovision: bool = False,
        adopt: bool = False,
        wait: bool = True,
        only: Sequence[str] | None = None,
        heal: bool = False,
    ) -> UpReport:
        """Lock, probe, decide, act. `only`: act on these hosts alone, the plan
        decided over every host (containers/subset.py: `--hosts` changes where,
        never what the rules allow). `heal`: a persistent set missing on some
        of those hosts while the others run it is started there (same image).
        On return the hosts stay locked SHARED (the
        containers are in use until `self.locks` is released); on an exception
        nothing stays locked.

        The first round trip locks shared: an attach changes nothing, so it
        never waits for other runs. Only a plan that starts, replaces, removes,
        provisions or restarts something takes the locks exclusively (waiting
        for the runs that use the containers, or refusing with `wait` False),
        probes again under them and decides again.
        """
        # Before touching any host: a value docker would refuse raises
        # ResourceError (exit 2) here instead of failing `docker run` midway.
        resources = cluster_effective_resources(self.cluster)
        self.script()  # an unreadable setup script: exit 2 before any host is contacted
        found = [*caps_warnings(self.cluster), *deprecation_warnings(self.cluster)]
        for w in [*found, *clamp_warnings(resources)]:
            self.sink.emit(Message(level="warning", text=w))
        try:
            states = await self.lock_and_probe("shared", wait=wait, purpose=self.purpose)
            plan = self.decide_for(states, only, force, reprovision, adopt, heal)
            if plan.changes and not plan.refused:
                # Exclusive where it acts (`only`); the other hosts' states stay
                # what the shared round read, and nothing is done there.
                fresh = await self.lock_and_probe(
                    "exclusive", wait=wait, purpose=self.purpose, hosts=only
                )
                states = {**states, **fresh}
                plan = self.decide_for(states, only, force, reprovision, adopt, heal)
            for said in plan.warnings:
                self.sink.emit(Message(level="warning", text=said))
            cpus = {h: s.cpu_count for h, s in states.items()}
            for warning in mpi.slots_warnings(self.cluster, cpus):
                self.sink.emit(Message(level="warning", text=warning))
            for host in plan.hosts("attach", "restart"):
                # Keeping a container keeps its limits; say where they are not
                # what the config now asks for instead of accepting them silently.
                for drift in limits_drift(plan.resources[host], states[host]):
                    self.sink.emit(
                        Message(level="warning", host=host, text=f"limits drift: {drift}")
                    )
            if plan.refused:
                raise PolicyRefused(plan.refusals)
            await tie_launches(self.cluster.slurm, self.cfg.lifetime, self.invocation, plan, states)
            report = await self._execute(plan, states)
            await self.locks.downgrade()
            self.facts.ready = {
                h: states[h].runtime
                for h, o in report.outcomes.items()
                if o.ok and states[h].runtime.known
            }
            return report
        except BaseException:
            await self.locks.release()
            raise

    def decide_for(
        self,
        states: Mapping[str, HostState],
        only: Sequence[str] | None,
        force: bool,
        reprovision: bool,
        adopt: bool,
        heal: bool = False,
    ) -> Plan:
        """The plan over every host, acting on `only` when given, completing a
        persistent set where it is missing with `heal` (containers/subset.py)."""
        chosen = deciding(states, only)
        plan = self.decide(chosen, force=force, reprovision=reprovision, adopt=adopt)
        if heal:
            wanted = sshd_wanted(self.cfg, len(self.cluster.hosts))
            mended = healed(plan, chosen, only, self.cfg, sshd=wanted, cluster_name=self.identity)
            if mended is not plan and not mended.refused:
                # The healed hosts' image step, GPUs and fitted resources, as
                # the plan gives any launching host its own.
                mended = with_host_facts(
                    self.cfg,
                    chosen,
                    mended,
                    cluster_name=self.identity,
                    resources=cluster_effective_resources(self.cluster),
                    slurm=self.cluster.slurm,
                )
            plan = mended
        plan = plan if only is None else narrowed(plan, only, self.name, unread(states, only))
        if plan.refused:
            return plan
        steps = {h: a.image_step if a.launches else None for h, a in plan.actions.items()}
        return replace(plan, spread=decide_spread(self.cfg, steps))

    async def _execute(self, plan: Plan, states: Mapping[str, HostState]) -> UpReport:
        """Act on a plan that was not refused: prepare the launching hosts,
        the barrier, then each host's pipeline; roll back what a failure
        leaves half started. Refuses (PolicyRefused) only what it learns
        while acting: a tag that resolves differently after a pull or load,
        a GPU request where the probe had not listed the GPUs."""
        outcomes = {h: HostOutcome(h, a) for h, a in plan.actions.items()}
        launching = [h for h, a in plan.actions.items() if a.launches]
        prepared: dict[str, Prepared] = {}
        preparer = Preparer(self.steps)

        async def prepare(host: str, peer_image: str | None = None) -> str | None:
            prepared[host] = await preparer.prepare(host, states[host], outcomes[host], peer_image)
            return prepared[host].tag_image_id if outcomes[host].ok else None

        if plan.spread is not None and plan.spread.peers:
            await preparer.spread(plan.spread, launching, states, outcomes, prepare)
        else:
            await fan_out(launching, prepare, limit=self.forks)
        if any(not outcomes[h].ok for h in launching):
            # Nothing has started anywhere yet: stop here, report per host. The
            # hosts that got their image are not ready either (never `ok` for a
            # container that was not started).
            failed = ", ".join(h for h in launching if not outcomes[h].ok)
            for host in launching:
                outcomes[host].hold_back(
                    f"the {plan.actions[host].kind.replace('_', ' ')} failed on {failed}"
                )
            return UpReport(plan, outcomes)
        selections = barrier(self.steps, launching, prepared, states, outcomes)
        keys = None
        if sshd_wanted(self.cluster.container, len(self.cluster.hosts)):
            keys = ClusterKeys.load_or_create(default_state_dir(self.cluster), self._hosts())
        chosen = {h: c.selection for h, c in selections.items()}
        self.gpu_counts = gpu_counts(chosen, states if self.cfg.gpus == "all" else {})
        each = HostPipeline(
            self.steps,
            self.identity,
            self.hash,
            self.invocation,
            self.script(),
            keys,
            self.gpu_counts,
        )

        async def pipeline(host: str) -> None:
            await each.run_host(
                host,
                states[host],
                outcomes[host],
                prepared.get(host, Prepared()),
                plan.resources[host],
                selections.get(host),
            )

        try:
            await fan_out(list(plan.actions), pipeline, limit=self.forks)
        except BaseException:
            # Interrupted (Ctrl-C) mid-start: per_run containers are disposable
            # and half-started ones would only confuse the next run.
            # A `docker run` cut short may still have created its container, so
            # every launching host is cleaned (they were ours to replace anyway).
            if self.cfg.lifetime in JOB_LIFETIMES:
                await roll_back(self.steps, self.invocation, launching, states, "interrupted")
            raise
        if keys is not None:
            await check_peers(self.steps, states, outcomes)
        started = [h for h in launching if any(s == "run" for s, _ in outcomes[h].steps)]
        failed = ", ".join(h for h in launching if not outcomes[h].ok)
        if self.cfg.lifetime == "per_run" and any(not o.ok for o in outcomes.values()):
            why = f"a per_run start failed on {failed}"
            await roll_back(self.steps, self.invocation, started, states, why, outcomes)
        elif any(not outcomes[h].ok and run_failed(outcomes[h]) for h in launching):
            # A partial cold start would leave a partial persistent set.
            why = f"the cold start failed on {failed}"
            await roll_back(self.steps, self.invocation, started, states, why, outcomes)
        return UpReport(plan, outcomes)

    async def down(
        self, *, force: bool = False, wait: bool = True, own_only: bool = False
    ) -> tuple[Plan, dict[str, HostResult]]:
        """Remove per the lifetime (plan/down.py), holding every host's lock
        exclusively; the removals by the container ID probed under the lock
        (containers/down.py). `own_only` (a run's tear-down) removes only
        containers this invocation started.
        """
        try:
            states = await self.lock_and_probe("exclusive", wait=wait, purpose="down")
            plan = decide_down(self.cfg, states, force=force, cluster_name=self.identity)
            if own_only:
                plan = only_started_by(plan, states, self.invocation)
            for w in plan.warnings:
                self.sink.emit(Message(level="warning", text=w))
            removing = plan.hosts("remove")
            removed = await remove_all(
                self.pool, self.sink, self.cfg, states, removing, forks=self.forks
            )
            return plan, removed
        finally:
            await self.locks.release()
