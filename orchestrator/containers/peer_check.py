"""Before `up` reports ready: from the head's container, every peer's
container sshd answers (`ssh PEER true` under the cluster's strict ssh
config), or the peer is not ready, named with ssh's reason.

    await check_peers(steps, states, outcomes)
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.containers import mpi
from orchestrator.containers.outcome import HostOutcome
from orchestrator.containers.probe import HostState
from orchestrator.containers.probe_request import sshd_on_host_network
from orchestrator.containers.provision import mpi_check_argv, mpi_check_bound
from orchestrator.containers.steps import Steps
from orchestrator.events import Message


async def check_peers(
    steps: Steps, states: Mapping[str, HostState], outcomes: Mapping[str, HostOutcome]
) -> None:
    """Before `up` reports ready: from the head's container, every peer's
    container sshd answers with the host key cvs gave it (`ssh PEER true`
    under the cluster's strict ssh config), each within ssh.connect_timeout.
    A peer that does not is not ready, named with ssh's reason. Only after
    some sshd was (re)started: an attach changed nothing."""
    cluster, cfg = steps.cluster, steps.cfg
    head = cluster.head_host.name
    if not sshd_on_host_network(cluster, cfg):
        return  # the peers' addresses are the hosts': only host networking reaches them
    if not any(step == "sshd" for o in outcomes.values() for step, _ in o.steps):
        return
    if head not in outcomes or not outcomes[head].ok:
        return
    peers = [h for h in mpi.mpi_order(cluster)[1:] if h in outcomes and outcomes[h].ok]
    if not peers:
        return
    per_peer, bound = mpi_check_bound(cluster)
    argv = mpi_check_argv(
        states[head].runtime.prefix,
        steps.name,
        per_peer,
        cfg.mpi.hostfile,
        peers,
        need_mpirun=False,
    )
    r = await steps.cmd(outcomes[head], "peers", argv, timeout=bound)
    if r is None:
        return
    found = mpi.parse_mpi_check(r.stdout)
    if found.ssh_missing:
        text = f"no ssh client in {head}'s container: the peers' sshd were not checked"
        steps.sink.emit(Message(level="warning", host=head, text=text))
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
        steps.step(peer, "peers", "failed", f"{peer}: {problem}")
