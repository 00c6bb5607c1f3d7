"""After an MPI job failed: which peer's container ended (issue 42, item 4).

`mpirun` on the head fails with its own code (205, 255) whichever rank's
container died; the host appears only inside Open MPI's text. So, once the
job has failed, cvs looks at every host's container: one bounded round trip
per host over the connection it already holds (remote/diagnose.sh, as after a
killed command), all at once. The hosts whose container exited or is gone are
named on the failed result, with what their runtime said (state, exit code,
OOMKilled); the decision is causes.peers_cause, pure.

    results = await name_ended_peers(pool, cluster, name, runtimes, results)

Whether a command is an MPI launch is containers/exec.py's `launches_mpi`.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config import ClusterConfig
from orchestrator.containers.causes import (
    ContainerFacts,
    diagnosis_command,
    hung_cause,
    peers_cause,
    read_diagnosis,
    with_cause,
)
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.seam import HostRunner


async def name_ended_peers(
    pool: HostRunner,
    cluster: ClusterConfig,
    name: str,
    runtimes: Mapping[str, ContainerRuntime],
    results: dict[str, HostResult],
) -> dict[str, HostResult]:
    """`results` of an MPI job, each failed one naming the peers (every host
    of the cluster) whose container exited or disappeared, with the evidence
    read on that host; unchanged when none did, or none failed."""
    failed = [h for h, r in results.items() if not r.ok]
    container = cluster.container
    if not failed or container is None:
        return results
    bound = container.runtime_timeout
    unprobed = ContainerRuntime.unprobed(container.runtime, container.rootless)

    async def look(host: str) -> ContainerFacts | None:
        runtime = runtimes.get(host) or unprobed
        answer = await pool.run(
            host,
            diagnosis_command(name, runtime),
            timeout=bound,
            stream_output=False,
            label="diagnose",
        )
        if answer.status == "timeout":
            return ContainerFacts(error=hung_cause(bound, runtime.name))
        if not answer.reached:
            return None
        return read_diagnosis(answer.stdout, runtime.name)

    hosts = [h.name for h in cluster.hosts]
    facts = await fan_out(hosts, look, limit=cluster.concurrency.hosts)
    elapsed = max(results[h].duration for h in failed)
    cause = peers_cause(facts, elapsed=elapsed, runtime=container.runtime)
    if cause is None:
        return results
    return {h: r if r.ok else with_cause(r, cause) for h, r in results.items()}
