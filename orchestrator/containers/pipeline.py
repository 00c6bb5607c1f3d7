"""One host's pipeline in `up`, after the barrier:

    [remove] -> run | restart -> [adopt] -> [provision] -> [sshd] -> [verify]

each step only when the plan's action for the host asks for it; the first
that fails ends the host's pipeline (its outcome says where). No step waits
for another host.

    await HostPipeline(steps, ...).run_host(host, state, outcome, prepared, resources, choice)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config import sshd_wanted
from orchestrator.containers.argv import (
    CONTAINER_ID_RE,
    run_argv,
    run_env_file,
    start_argv,
    unpause_argv,
)
from orchestrator.containers.down import remove_command
from orchestrator.containers.inspection import parse_run_id
from orchestrator.containers.labels import managed_labels
from orchestrator.containers.outcome import HostOutcome
from orchestrator.containers.plan.facts import GPUChoice
from orchestrator.containers.prepare import Prepared
from orchestrator.containers.probe import HostState
from orchestrator.containers.provision import SetupScript, ensure_sshd, run_setup_script
from orchestrator.containers.steps import Steps
from orchestrator.events import Message
from orchestrator.limits.resources import EffectiveResources
from orchestrator.remote import records
from orchestrator.ssh.keys import ClusterKeys

# What remote/setup.sh says on stderr when it stopped an earlier, orphaned run.
STOPPED_STALE_SETUP = "cvs: stopped a setup script still running"


@dataclass(frozen=True)
class HostPipeline:
    """The steps after the barrier, for one `up` of one cluster's container."""

    steps: Steps
    identity: str  # the cluster's, on the container's labels
    config_hash: str
    invocation: str
    script: SetupScript
    keys: ClusterKeys | None  # None: no in-container sshd
    gpu_counts: Mapping[str, int]  # the MPI hostfile's slots

    async def run_host(
        self,
        host: str,
        state: HostState,
        outcome: HostOutcome,
        prepared: Prepared,
        resources: EffectiveResources,
        choice: GPUChoice | None,
    ) -> None:
        """One host's steps, in order, each only when the plan asks for it;
        the first that fails ends the host's pipeline (its outcome says where)."""
        action, keys, cmd = outcome.action, self.keys, self.steps.cmd
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
            if await cmd(outcome, "restart", resume(prefix, self.steps.name)) is None:
                return
        if action.adopt:
            record = records.adopted_argv(state.container_id, self.identity)
            timeout = self.steps.cluster.ssh.command_timeout
            if await cmd(outcome, "adopt", record, timeout=timeout) is None:
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
        return await self.steps.cmd(outcome, "remove", remove_command(prefix, victim)) is not None

    async def _run(
        self,
        outcome: HostOutcome,
        prefix: list[str],
        prepared: Prepared,
        resources: EffectiveResources,
        choice: GPUChoice | None,
    ) -> bool:
        """`docker run -d` as the plan says; the container's ID is noted."""
        action, base, cluster = outcome.action, self.steps.cfg, self.steps.cluster
        cfg = base.model_copy(update={"devices": prepared.devices})
        gpus = choice.selection if choice is not None else None
        labels = managed_labels(
            self.identity,
            self.config_hash,
            lifetime=base.lifetime,
            invocation=self.invocation,
            sshd_port=base.sshd.port if sshd_wanted(base, len(cluster.hosts)) else None,
            slurm_job=cluster.slurm.job_id if cluster.slurm else None,
            gpus=tuple(g.index for g in gpus.gpus) if gpus is not None else None,
        )
        argv = run_argv(
            prefix,
            cfg,
            self.steps.name,
            labels,
            resources=resources,
            gpus=gpus,
            cdi=choice.cdi if choice is not None else None,
            keep_groups=action.keep_groups,  # the plan's, from the probed OCI runtime
        )
        run = await self.steps.cmd(
            outcome, "run", argv, timeout=base.start_timeout, input=run_env_file(cfg, gpus)
        )
        if run is None:
            return False
        outcome.container_id = parse_run_id(run.stdout)
        return True

    async def _provision(
        self, host: str, state: HostState, outcome: HostOutcome, prefix: list[str]
    ) -> bool:
        """The setup script in the container (provision.py)."""
        steps = self.steps
        steps.step(host, "provision", "started")
        launched = outcome.action.launches
        r = await run_setup_script(
            steps.pool,
            host,
            prefix,
            steps.name,
            self.script,
            timeout=steps.cfg.start_timeout,
            container_id=_valid_id(outcome.container_id if launched else state.container_id),
        )
        outcome.steps.append(("provision", r))
        for line in r.stderr.splitlines():
            if line.startswith(STOPPED_STALE_SETUP):
                # An interrupted invocation's setup was still running (issue 22).
                steps.sink.emit(Message(level="warning", host=host, text=line[5:]))
        if not r.ok:
            outcome.fail("provision", r, r.error or r.status)
            steps.step(host, "provision", "failed", r.tail(10))
            return False
        steps.step(host, "provision", "ok")
        return True

    async def _sshd(
        self, host: str, outcome: HostOutcome, prefix: list[str], keys: ClusterKeys
    ) -> bool:
        """The in-container sshd, (re)started (provision.py)."""
        steps = self.steps
        steps.step(host, "sshd", "started")
        r = await ensure_sshd(
            steps.pool, host, prefix, steps.name, steps.cluster, keys, self.gpu_counts
        )
        outcome.steps.append(("sshd", r))
        if not r.ok:
            outcome.fail("sshd", r, r.error or r.status)
            steps.step(host, "sshd", "failed", r.tail(5))
            return False
        steps.step(host, "sshd", "ok", r.stdout.strip().splitlines()[-1] if r.stdout else "")
        return True

    async def _verify(self, outcome: HostOutcome, prefix: list[str]) -> None:
        """The container runs after a start."""
        name = self.steps.name
        check = [*prefix, "inspect", "--type", "container", "-f", "{{.State.Running}}", name]
        verified = await self.steps.cmd(outcome, "verify", check)
        if verified is not None and verified.stdout.strip() != "true":
            outcome.fail("verify", verified, "the container is not running after start")


def _valid_id(container_id: str | None) -> str | None:
    return container_id if container_id and CONTAINER_ID_RE.fullmatch(container_id) else None
