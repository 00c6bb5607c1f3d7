"""One step of a host's pipeline in `up`: its events (started, ok, failed),
its bound, and, when it fails, the host's outcome marked with the words for
what stopped it (a timeout naming the setting that raises it, a cause the
output names).

    steps = Steps(cluster, cfg, name, pool, sink)
    result = await steps.cmd(outcome, "pull", argv, budget=budget)  # None: failed
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from orchestrator.config import ClusterConfig, ContainerConfig
from orchestrator.containers.argv import bounded_argv
from orchestrator.containers.causes import output_cause, pull_cause
from orchestrator.containers.outcome import HostOutcome
from orchestrator.containers.pull_progress import PullProgress
from orchestrator.containers.timeouts import StartBudget, timeout_message
from orchestrator.errors import Phrase, Text
from orchestrator.events import EventSink, HostStep
from orchestrator.results import HostResult
from orchestrator.ssh.seam import HostRunner


@dataclass(frozen=True)
class Steps:
    """What `up`'s steps on one cluster's container run through: its config,
    the container's name, the hosts' runner and the events' sink."""

    cluster: ClusterConfig
    cfg: ContainerConfig
    name: str
    pool: HostRunner
    sink: EventSink

    @property
    def forks(self) -> int:
        """How many hosts `up` and `down` act on at once (`concurrency.hosts`,
        `--forks`): pulls, starts, setup scripts and removals.

        Not the probe and the lock: that round trip changes nothing, costs one
        docker process per host, and a lock that is held is an idle channel;
        doing it a few hosts at a time would only multiply an attach's
        latency (docs/design.md, "What an attach costs")."""
        return self.cluster.concurrency.hosts

    def step(self, host: str, step: str, status: str, detail: Text = "") -> None:
        self.sink.emit(HostStep(host=host, step=step, status=status, detail=detail))  # type: ignore[arg-type]

    async def cmd(
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
        self.step(outcome.host, step, "started")
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
                    self.step(outcome.host, step, "failed", message)
                    return None
            outcome.fail(step, result, message)
            self.step(outcome.host, step, "failed", result.tail(5) or message)
            return None
        self.step(outcome.host, step, "ok")
        return result
