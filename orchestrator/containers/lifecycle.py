"""Executing the container lifecycle: lock + probe, plan, per-host pipelines.

`up` takes, per host, a lock on the host and probes it in the same round
trip (the lock is held by the probing process until we are done), decides a
`Plan` with the pure `decide_plan`, then runs each host's pipeline on its own:

    prepare (login, load | pull, image id, devices, GPUs)   per host
    -- barrier: the tag resolves to one image everywhere; GPU requests fit --
    [remove] -> run -> provision -> sshd -> verify           per host

The barrier is the one place all hosts must agree before anything starts;
no other step waits for the fleet.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import anyio

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
from orchestrator.containers.argv import (
    CONTAINER_ID_RE,
    bounded_argv,
    image_inspect_argv,
    load_argv,
    login_command,
    pull_argv,
    remove_started_by_command,
    run_argv,
    run_env_file,
    start_argv,
    unpause_argv,
)
from orchestrator.containers.causes import output_cause, pull_cause
from orchestrator.containers.down import only_started_by, remove_all, remove_command
from orchestrator.containers.drift import limits_drift
from orchestrator.containers.inspection import parse_image_inspect, parse_run_id
from orchestrator.containers.invocation import Invocation
from orchestrator.containers.jobend import JOB_LIFETIMES
from orchestrator.containers.labels import config_hash, managed_labels
from orchestrator.containers.locks import HostLocks, Mode
from orchestrator.containers.outcome import HostOutcome, UpReport, changed_so_far, run_failed
from orchestrator.containers.plan.down import decide_down
from orchestrator.containers.plan.facts import GPUChoice, choose_gpus, with_host_facts
from orchestrator.containers.plan.images import check_tag_identity
from orchestrator.containers.plan.lifetimes import decide_plan
from orchestrator.containers.plan.model import DOWN_FORCE, HostAction, Plan
from orchestrator.containers.probe import HostState, parse_probe_output, probe_argv
from orchestrator.containers.provision import (
    MARKER_PATH,
    SetupScript,
    ensure_sshd,
    mpi_check_argv,
    mpi_check_bound,
    run_setup_script,
)
from orchestrator.containers.pull_progress import PullProgress
from orchestrator.containers.slurm_tie import tie_launches
from orchestrator.containers.spread import Prepare, spread_and_prepare
from orchestrator.containers.spread_plan import SpreadPlan, decide_spread
from orchestrator.containers.subset import deciding, healed, narrowed, unread
from orchestrator.containers.timeouts import StartBudget, runtime_gave_up, timeout_message
from orchestrator.errors import Phrase, PolicyRefused, Refusal, Text, UsageError
from orchestrator.events import EventSink, HostStep, Message
from orchestrator.limits.cdi import SpecFile, describe_devices, spec_files
from orchestrator.limits.gpus import GPU, GPUSelection, discovery_argv, parse_discovery
from orchestrator.limits.resources import (
    EffectiveResources,
    clamp_warnings,
    cluster_effective_resources,
)
from orchestrator.limits.rootless import wants_devices
from orchestrator.remote import records
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.keys import ClusterKeys, default_state_dir
from orchestrator.ssh.seam import HostRunner

# What remote/setup.sh says on stderr when it stopped an earlier, orphaned run.
STOPPED_STALE_SETUP = "cvs: stopped a setup script still running"


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
        self._pulls: PullProgress | None = None  # the pulling hosts' progress
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
    def forks(self) -> int:
        """How many hosts `up` and `down` act on at once (`concurrency.hosts`,
        `--forks`): pulls, starts, setup scripts and removals.

        Not the probe and the lock: that round trip changes nothing, costs one
        docker process per host, and a lock that is held is an idle channel;
        doing it a few hosts at a time would only multiply an attach's
        latency (docs/design.md, "What an attach costs")."""
        return self.cluster.concurrency.hosts

    # -- probing --------------------------------------------------------

    def _probe_argv(self, host: str) -> list[str]:
        # The GPUs are listed where a container will launch, so the plan can
        # select them: every host for per_run, else where none runs (never on
        # the attach path: it stays one docker process and nothing else).
        gpus: Literal["always", "stopped"] | None = None
        when: Literal["always", "stopped"] = (
            "always" if self.cfg.lifetime == "per_run" else "stopped"
        )
        if self.cfg.gpus is not None and self.cfg.lifetime != "no_launch":
            gpus = when
        # Rootless podman launching with devices: crun or runc decides whether
        # `--group-add keep-groups` can give them (limits/rootless.py).
        oci = (
            when
            if self.cfg.rootless and wants_devices(self.cfg) and self.cfg.lifetime != "no_launch"
            else None
        )
        runtime = ContainerRuntime.unprobed(self.cfg.runtime, self.cfg.rootless)
        # GPUs through CDI on a runtime whose CDI depends on its version: ask it.
        version = gpus if self.cfg.cdi == "always" and runtime.cdi_since is not None else None
        return probe_argv(
            self.cfg,
            self.name,
            sshd_port=self.cfg.sshd.port,
            marker_path=MARKER_PATH,
            port_check=self._sshd_on_host_network(),
            gpus=gpus,
            gpu_root=self.cluster.host(host).gpu_device_root or "/",
            runtime=runtime,
            oci=oci,
            version=version,
        )

    def _sshd_on_host_network(self) -> bool:
        """The in-container sshd binds in the host's network namespace."""
        return sshd_wanted(self.cfg, len(self.cluster.hosts)) and self.cfg.network == "host"

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
            return HostState.hung(host, self.runtime_hung_error("the probe"))
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

    def _step(self, host: str, step: str, status: str, detail: Text = "") -> None:
        self.sink.emit(HostStep(host=host, step=step, status=status, detail=detail))  # type: ignore[arg-type]

    async def _cmd(
        self,
        outcome: HostOutcome,
        step: str,
        command: str | list[str],
        *,
        timeout: float | None = None,
        input: str | None = None,
        budget: StartBudget | None = None,
        watch: PullProgress | None = None,
    ) -> HostResult | None:
        """Run one pipeline step; on failure mark the outcome and return None.

        `budget`: the step runs within what is left of the host's
        `container.start_timeout` (login, load and pull share it), and a
        timeout says so. Otherwise `timeout` (default: a docker call's
        `container.runtime_timeout`) bounds it.
        """
        self._step(outcome.host, step, "started")
        if budget is not None:
            timeout = budget.left()
            command = bounded_argv(command)  # nothing left running when it gives up
        elif timeout is None:
            timeout = self.cfg.runtime_timeout
        # `watch`: the step's bytes as it runs (a pull, on a terminal).
        run = self.pool.run if watch is None else functools.partial(watch.run, self.pool)
        result = await run(
            outcome.host, command, timeout=timeout, input=input, stream_output=False, label=step
        )
        outcome.steps.append((step, result))
        if not result.ok:
            message: Text = result.error or result.status
            if result.status == "timeout":
                message = timeout_message(self.cfg, step, budget, timeout)
            else:
                # The cause when the output names one (a full disk), not just the code.
                cause = output_cause(result.stdout, result.stderr)
                message = Phrase(message, f": {cause}") if cause else message
                if step == "pull" and cause is None:
                    # The image and the registry named once, with its words (issue 30).
                    message = pull_cause(self.cfg.image, result.stderr or result.stdout)
                    outcome.fail(step, replace(result, stdout="", stderr=""), message)
                    self._step(outcome.host, step, "failed", message)
                    return None
            outcome.fail(step, result, message)
            self._step(outcome.host, step, "failed", result.tail(5) or message)
            return None
        self._step(outcome.host, step, "ok")
        return result

    def runtime_hung_error(self, what: str) -> str:
        """Why a runtime call was given up on (timeouts.py)."""
        return runtime_gave_up(self.cfg, what)

    async def _prepare(
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
        cfg, action = self.cfg, outcome.action
        steps = [*(["login"] if action.login else []), action.image_step or "pull"]
        budget = StartBudget(cfg.start_timeout, " and ".join(steps))
        if action.login and cfg.registry is not None:
            login = login_command(
                prefix, cfg.registry, cfg.image, tls_verify=cfg.registry_tls_verify
            )
            if await self._cmd(outcome, "login", login, budget=budget) is None:
                return None
        if action.image_step == "load" and cfg.image_tar is not None:
            r = await self._cmd(outcome, "load", load_argv(prefix, cfg.image_tar), budget=budget)
        else:
            rt = ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)
            watch = PullProgress.for_pool(self.pool, self.sink, rt, cfg.image)
            if watch is not None:
                self._pulls = watch = self._pulls or watch  # one fleet ETA
            argv = pull_argv(prefix, cfg.image, tls_verify=cfg.registry_tls_verify)
            r = await self._cmd(outcome, "pull", argv, budget=budget, watch=watch)
        if r is None:
            return None
        r = await self._cmd(outcome, "image", image_inspect_argv(prefix, cfg.image))
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
        r = await self._cmd(
            outcome, "gpus", discovery_argv(root), timeout=self.cluster.ssh.command_timeout
        )
        if r is None:
            return
        prepared.gpus = parse_discovery(r.stdout)
        prepared.cdi_specs = spec_files(r.stdout)
        if self.cfg.cdi == "always" and state.runtime.cdi_since is not None:
            argv = [*state.runtime.prefix, "version", "--format", "{{.Server.Version}}"]
            v = await self._cmd(outcome, "version", argv)
            prepared.runtime_version = v.stdout.strip() if v is not None else None

    async def _present_devices(self, outcome: HostOutcome) -> list[str]:
        """The configured `devices` that exist on this host (`/dev/infiniband/*` expanded)."""
        if not self.cfg.devices:
            return []
        paths = [d.split(":", 1)[0] for d in self.cfg.devices]
        script = 'for p in "$@"; do for f in $p; do [ -e "$f" ] && echo "$f"; done; done; true'
        r = await self._cmd(
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

        async def prepare(host: str, peer_image: str | None = None) -> str | None:
            prepared[host] = await self._prepare(host, states[host], outcomes[host], peer_image)
            return prepared[host].tag_image_id if outcomes[host].ok else None

        if plan.spread is not None and plan.spread.peers:
            await self._spread(plan.spread, launching, states, outcomes, prepare)
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
        selections = self._barrier(launching, prepared, states, outcomes)
        keys = None
        if sshd_wanted(self.cluster.container, len(self.cluster.hosts)):
            keys = ClusterKeys.load_or_create(default_state_dir(self.cluster), self._hosts())
        chosen = {h: c.selection for h, c in selections.items()}
        self.gpu_counts = gpu_counts(chosen, states if self.cfg.gpus == "all" else {})

        async def pipeline(host: str) -> None:
            await self._host_pipeline(
                host,
                states[host],
                outcomes[host],
                prepared.get(host, Prepared()),
                keys,
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
                await self._roll_back(launching, states, "interrupted")
            raise
        if keys is not None:
            await self._check_peers(states, outcomes)
        started = [h for h in launching if any(s == "run" for s, _ in outcomes[h].steps)]
        failed = ", ".join(h for h in launching if not outcomes[h].ok)
        if self.cfg.lifetime == "per_run" and any(not o.ok for o in outcomes.values()):
            await self._roll_back(started, states, f"a per_run start failed on {failed}", outcomes)
        elif any(not outcomes[h].ok and run_failed(outcomes[h]) for h in launching):
            # A partial cold start would leave a partial persistent set.
            await self._roll_back(started, states, f"the cold start failed on {failed}", outcomes)
        return UpReport(plan, outcomes)

    async def _spread(
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
            self._step(host, "spread", "failed", why)

        def received(host: str, feeder: str, seconds: float) -> None:
            said = f"from {feeder}, image ID checked"
            done = HostResult(host, "ok", exit_code=0, stdout=said, duration=seconds)
            outcomes[host].steps.append(("spread", done))
            self._step(host, "spread", "ok", said)

        hosts = [spread.seed or "", *spread.receivers]
        runtimes = {h: states[h].runtime for h in hosts if h in states}
        # Where a peer reaches each host's sshd: where cvs itself does (transport `direct`).
        specs = {h: self.cluster.host(h) for h in hosts if h}
        ssh_port = self.cluster.ssh.port
        endpoints = {h: (s.address or s.name, s.port or ssh_port) for h, s in specs.items()}
        await spread_and_prepare(
            self.pool,
            self.sink,
            self.cfg,
            spread,
            launching,
            runtimes,
            prepare=prepare,
            fail=fail,
            received=received,
            forks=self.forks,
            endpoints=endpoints,
        )

    async def _check_peers(
        self, states: Mapping[str, HostState], outcomes: Mapping[str, HostOutcome]
    ) -> None:
        """Before `up` reports ready: from the head's container, every peer's
        container sshd answers with the host key cvs gave it (`ssh PEER true`
        under the cluster's strict ssh config), each within ssh.connect_timeout.
        A peer that does not is not ready, named with ssh's reason. Only after
        some sshd was (re)started: an attach changed nothing."""
        head = self.cluster.head_host.name
        if not self._sshd_on_host_network():
            return  # the peers' addresses are the hosts': only host networking reaches them
        if not any(step == "sshd" for o in outcomes.values() for step, _ in o.steps):
            return
        if head not in outcomes or not outcomes[head].ok:
            return
        peers = [h for h in mpi.mpi_order(self.cluster)[1:] if h in outcomes and outcomes[h].ok]
        if not peers:
            return
        per_peer, bound = mpi_check_bound(self.cluster)
        argv = mpi_check_argv(
            states[head].runtime.prefix,
            self.name,
            per_peer,
            self.cfg.mpi.hostfile,
            peers,
            need_mpirun=False,
        )
        r = await self._cmd(outcomes[head], "peers", argv, timeout=bound)
        if r is None:
            return
        found = mpi.parse_mpi_check(r.stdout)
        if found.ssh_missing:
            text = f"no ssh client in {head}'s container: the peers' sshd were not checked"
            self.sink.emit(Message(level="warning", host=head, text=text))
        # A container kept (adopted, attached) runs on the network it was
        # created with; one this `up` started has the file's.
        modes = {
            h: s.exec_facts.network_mode
            for h, s in states.items()
            if s.exec_facts and h in outcomes and not outcomes[h].action.launches
        }
        for peer, why in found.peers_failed:
            problem = found.peer_problem(peer, why, head, per_peer, modes)
            outcomes[peer].fail("peers", None, problem)
            self._step(peer, "peers", "failed", f"{peer}: {problem}")

    def _barrier(
        self,
        launching: list[str],
        prepared: Mapping[str, Prepared],
        states: Mapping[str, HostState],
        outcomes: Mapping[str, HostOutcome],
    ) -> dict[str, GPUChoice]:
        """Refuse before any container starts if the tag or the GPU requests
        disagree; otherwise the GPUs each launching host gives its container.

        These are the refusals the plan cannot make: they depend on what the
        prepare step found (a tag after a pull or load, GPUs the probe had not
        listed), each with its kind. The refusal says what the prepare step
        did change (an image pulled or loaded, a registry login): not
        "nothing"."""
        if not launching:
            return {}
        after_pull = {
            h: replace(
                states[h],
                tag_image_id=prepared[h].tag_image_id,
                tag_repo_digests=prepared[h].tag_repo_digests,
            )
            for h in launching
        }
        reasons = check_tag_identity(after_pull, image=self.cfg.image)
        choices: dict[str, GPUChoice] = {}
        for host in launching:
            choice = self._gpu_choice(host, outcomes[host].action, prepared[host])
            if isinstance(choice, Refusal):
                reasons.append(choice)
            elif choice is not None:
                choices[host] = choice
        if reasons:
            raise PolicyRefused(
                reasons, changed=changed_so_far(self.cfg.image, launching, outcomes)
            )
        for host, choice in choices.items():
            if choice.cdi is not None:
                text = f"GPUs through CDI: {describe_devices(choice.cdi)}"
                self.sink.emit(Message(level="info", host=host, text=text))
        return choices

    def _gpu_choice(
        self, host: str, action: HostAction, prepared: Prepared
    ) -> GPUChoice | Refusal | None:
        """The plan's choice of GPUs, or (GPUs not listed by the probe) the same
        decision from what the prepare step listed; None: no GPU request."""
        if action.gpus is not None:
            return GPUChoice(action.gpus, action.cdi)
        if self.cfg.gpus is None or prepared.gpus is None:
            return None
        return choose_gpus(
            self.cfg,
            host,
            prepared.gpus,
            prepared.cdi_specs,
            prepared.runtime_version,
            slurm=self.cluster.slurm,
        )

    async def _host_pipeline(
        self,
        host: str,
        state: HostState,
        outcome: HostOutcome,
        prepared: Prepared,
        keys: ClusterKeys | None,
        resources: EffectiveResources,
        choice: GPUChoice | None,
    ) -> None:
        """One host's steps, in order, each only when the plan asks for it;
        the first that fails ends the host's pipeline (its outcome says where)."""
        action = outcome.action
        if action.kind in ("verify", "none"):
            return
        prefix = state.runtime.prefix
        if action.remove_first and not await self._remove_first(state, outcome, prefix):
            return
        if action.launches:
            if not await self._run(outcome, prefix, prepared, resources, choice):
                return
        elif action.kind == "restart":
            # Resume in place (a stopped or paused container keeps its overlay).
            resume = unpause_argv if action.unpause else start_argv
            if await self._cmd(outcome, "restart", resume(prefix, self.name)) is None:
                return
        if action.adopt:
            record = records.adopted_argv(state.container_id, self.identity)
            timeout = self.cluster.ssh.command_timeout
            if await self._cmd(outcome, "adopt", record, timeout=timeout) is None:
                return
        if action.provision and not await self._provision(host, state, outcome, prefix):
            return
        restarted = action.launches or action.kind == "restart"
        wants_sshd = keys is not None and (action.start_sshd or restarted)
        if keys is not None and wants_sshd and not await self._sshd(host, outcome, prefix, keys):
            return
        if restarted:
            await self._verify(outcome, prefix)

    async def _remove_first(
        self, state: HostState, outcome: HostOutcome, prefix: list[str]
    ) -> bool:
        """The same-named container goes first: by the ID probed under the
        exclusive lock, never by name."""
        victim = state.container_id
        if not victim or not CONTAINER_ID_RE.fullmatch(victim):
            outcome.fail("remove", None, f"no container ID to remove from the probe ({victim})")
            return False
        return await self._cmd(outcome, "remove", remove_command(prefix, victim)) is not None

    async def _run(
        self,
        outcome: HostOutcome,
        prefix: list[str],
        prepared: Prepared,
        resources: EffectiveResources,
        choice: GPUChoice | None,
    ) -> bool:
        """`docker run -d` as the plan says; the container's ID is noted."""
        action = outcome.action
        cfg = self.cfg.model_copy(update={"devices": prepared.devices})
        gpus = choice.selection if choice is not None else None
        labels = managed_labels(
            self.identity,
            self.hash,
            lifetime=self.cfg.lifetime,
            invocation=self.invocation,
            sshd_port=self.cfg.sshd.port if sshd_wanted(self.cfg, len(self._hosts())) else None,
            slurm_job=self.cluster.slurm.job_id if self.cluster.slurm else None,
            gpus=tuple(g.index for g in gpus.gpus) if gpus is not None else None,
        )
        argv = run_argv(
            prefix,
            cfg,
            self.name,
            labels,
            resources=resources,
            gpus=gpus,
            cdi=choice.cdi if choice is not None else None,
            keep_groups=action.keep_groups,  # the plan's, from the probed OCI runtime
        )
        run = await self._cmd(
            outcome, "run", argv, timeout=self.cfg.start_timeout, input=run_env_file(cfg, gpus)
        )
        if run is None:
            return False
        outcome.container_id = parse_run_id(run.stdout)
        return True

    async def _provision(
        self, host: str, state: HostState, outcome: HostOutcome, prefix: list[str]
    ) -> bool:
        """The setup script in the container (provision.py)."""
        self._step(host, "provision", "started")
        launched = outcome.action.launches
        r = await run_setup_script(
            self.pool,
            host,
            prefix,
            self.name,
            self.script(),
            timeout=self.cfg.start_timeout,
            container_id=_valid_id(outcome.container_id if launched else state.container_id),
        )
        outcome.steps.append(("provision", r))
        for line in r.stderr.splitlines():
            if line.startswith(STOPPED_STALE_SETUP):
                # An interrupted invocation's setup was still running (issue 22).
                self.sink.emit(Message(level="warning", host=host, text=line[5:]))
        if not r.ok:
            outcome.fail("provision", r, r.error or r.status)
            self._step(host, "provision", "failed", r.tail(10))
            return False
        self._step(host, "provision", "ok")
        return True

    async def _sshd(
        self, host: str, outcome: HostOutcome, prefix: list[str], keys: ClusterKeys
    ) -> bool:
        """The in-container sshd, (re)started (provision.py)."""
        self._step(host, "sshd", "started")
        r = await ensure_sshd(
            self.pool, host, prefix, self.name, self.cluster, keys, self.gpu_counts
        )
        outcome.steps.append(("sshd", r))
        if not r.ok:
            outcome.fail("sshd", r, r.error or r.status)
            self._step(host, "sshd", "failed", r.tail(5))
            return False
        self._step(host, "sshd", "ok", r.stdout.strip().splitlines()[-1] if r.stdout else "")
        return True

    async def _verify(self, outcome: HostOutcome, prefix: list[str]) -> None:
        """The container runs after a start."""
        check = [*prefix, "inspect", "--type", "container", "-f", "{{.State.Running}}", self.name]
        verified = await self._cmd(outcome, "verify", check)
        if verified is not None and verified.stdout.strip() != "true":
            outcome.fail("verify", verified, "the container is not running after start")

    async def _roll_back(
        self,
        hosts: list[str],
        states: Mapping[str, HostState],
        why: str,
        outcomes: Mapping[str, HostOutcome] | None = None,
    ) -> None:
        """Remove what this attempt made on `hosts`: by the ID `docker run`
        printed, else (run cut short) only a container with our label; a
        foreign container holding the name is never touched."""
        if not hosts:
            return
        self.sink.emit(
            Message(
                level="warning",
                text=f"{why}: removing the containers this attempt made on {', '.join(hosts)}",
            )
        )

        async def remove(host: str) -> None:
            # Only what this invocation started (its label), even when the
            # `docker run` was cut short before it told us the container ID.
            runtime = states[host].runtime
            command = remove_started_by_command(
                runtime.prefix,
                self.name,
                self.invocation,
                then=records.forget_listed_command(),
                name_filter=runtime.name_filter(self.name),
            )
            r = await self.pool.run(
                host,
                command,
                timeout=self.cfg.runtime_timeout,
                stream_output=False,
                label="rollback",
            )
            outcome = (outcomes or {}).get(host)
            if outcome is None:
                return
            # The report must not call ready what no longer exists.
            outcome.steps.append(("rollback", r))
            if r.ok:
                outcome.roll_back(why)
            else:
                outcome.roll_back(
                    Phrase(
                        why,
                        f"; removing its container failed ({r.error or r.status}): ",
                        DOWN_FORCE,
                        " once the host answers",
                    )
                )
            self._step(host, "rollback", "ok" if r.ok else "failed", outcome.rolled_back or "")

        with anyio.CancelScope(shield=True):
            await fan_out(hosts, remove, limit=self.forks)

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


def host_locks(
    cluster: ClusterConfig, pool: HostRunner, sink: EventSink, invocation: Invocation | None = None
) -> HostLocks:
    """The lock set for this cluster's container on its hosts; what it lets go
    `invocation` hears of."""
    cfg = cluster.container
    wait = float(cfg.start_timeout) if cfg is not None else 900.0
    return HostLocks(
        pool,
        sink,
        container_name(cluster),
        head=cluster.head_host.name,
        wait_seconds=wait,
        probe_seconds=cfg.runtime_timeout if cfg is not None else 30.0,
        runtime=cfg.runtime if cfg is not None else "docker",
        on_release=invocation.let_go if invocation is not None else None,
    )


def gpu_counts(
    selections: Mapping[str, GPUSelection], states: Mapping[str, HostState]
) -> dict[str, int]:
    """GPUs per host for the MPI hostfile's slots: what a launching host's
    container gets, else (pass `states` for `gpus: all` only) what the probe
    listed on the host."""
    counts = {h: len(s.gpus) for h, s in selections.items()}
    for host, state in states.items():
        if host not in counts and state.gpus is not None:
            counts[host] = len(state.gpus)
    return counts


def _valid_id(container_id: str | None) -> str | None:
    return container_id if container_id and CONTAINER_ID_RE.fullmatch(container_id) else None
