"""Example: a pytest module driving the fleet through cvs-orchestrator's plugin.

The plugin (installed with the package) adds `--cvs-orchestrator-cluster` and a
session-scoped `cluster` fixture: the containers are brought up per the
cluster's lifetime before the first test that uses it and down after the last.

    pytest orchestrator/examples/test_with_cluster.py \
        --cvs-orchestrator-cluster /tmp/cvs-sandbox/cluster.yaml

Without a cluster file (and no $CVS_CLUSTER) these tests are skipped.
"""

from __future__ import annotations

from orchestrator.sync import SyncCluster


def test_every_host_runs_a_command(cluster: SyncCluster) -> None:
    results = cluster.exec("echo ready on $(uname -n)")
    assert set(results) == set(cluster.hosts)
    failed = {h: f"{r.status}: {r.error}" for h, r in results.items() if not r.ok}
    assert not failed, failed
    assert all(r.stdout.startswith("ready on ") for r in results.values())


def test_a_failing_command_is_reported_per_host(cluster: SyncCluster) -> None:
    results = cluster.exec(["sh", "-c", "exit 3"], hosts=cluster.hosts[:1])
    (only,) = results.values()
    assert (only.ok, only.status, only.exit_code) == (False, "failed", 3)


def test_head_host_alone(cluster: SyncCluster) -> None:
    head = cluster.config.head_host.name
    results = cluster.exec("printf %s ok", hosts=[head])
    assert list(results) == [head] and results[head].stdout == "ok"
