"""Which way a command reaches a container (containers/route.py): the pure
decision, row by row of its table; the paths themselves run on the sandbox
(test_sshexec_sandbox.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from orchestrator.containers.route import ExecFacts, RouteFacts, RuntimeExec, Sshd, route

KEY = "ssh-ed25519 AAAA"
RUNNING = ExecFacts(
    container_id="c" * 64,
    running=True,
    started_at="2026-11-27T10:00:00Z",
    user="",
    workdir="/work",
    env=(),
    hostname="node1",
    network_mode="host",
    addresses=(),
    sshd_port=2299,
)
OPEN = RouteFacts(
    closed=None,
    off=None,
    container=RUNNING,
    host_key=KEY,
    user=None,
    workdir=None,
    default_port=2224,
)


def _facts(container: dict[str, Any] | None = None, **over: Any) -> RouteFacts:
    return replace(OPEN, container=replace(RUNNING, **(container or {})), **over)


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        (_facts(closed="its containers run no sshd"), "its containers run no sshd"),
        (_facts(off="its sshd refused the key"), "its sshd refused the key"),
        (replace(OPEN, container=None), "the container could not be inspected"),
        (_facts({"running": False}), "the container is not running"),
        (_facts(host_key=None), "no host key of its sshd in the state directory"),
        (_facts(user="alice"), "user 'alice': its sshd lets in root and 'root' by name only"),
        (_facts({"user": "bob"}, user="alice"), "lets in root and 'bob'"),
        (_facts(user="0:0"), "user '0:0'"),
        (_facts(user="1000"), "user '1000'"),
        (_facts({"user": "bob:grp"}), "user 'bob:grp'"),
        (_facts({"network_mode": "none"}), "its network (none) has no address"),
        (_facts({"network_mode": "container:abc"}), "(container:abc) has no address"),
        (_facts({"network_mode": "bridge"}), "(bridge) has no address"),
        (_facts({"workdir": "relative"}), "working directory 'relative'"),
    ],
)
def test_a_fact_the_sshd_path_cannot_serve_routes_to_the_runtime(
    facts: RouteFacts, why: str
) -> None:
    way = route(facts)
    assert isinstance(way, RuntimeExec) and why in str(way.why), way


def test_a_closed_path_wins_over_every_later_fact() -> None:
    way = route(replace(OPEN, closed="closed", off="off", container=None, host_key=None))
    assert way == RuntimeExec("closed")


@pytest.mark.parametrize(
    ("facts", "want"),
    [
        (OPEN, ("127.0.0.1", 2299, "root", "/work")),
        (_facts({"sshd_port": None}), ("127.0.0.1", 2224, "root", "/work")),
        (_facts({"workdir": ""}), ("127.0.0.1", 2299, "root", "/")),
        (_facts(workdir="/tmp"), ("127.0.0.1", 2299, "root", "/tmp")),
        (_facts(user="0"), ("127.0.0.1", 2299, "root", "/work")),
        (_facts({"user": "bob:grp"}, user="bob"), ("127.0.0.1", 2299, "bob", "/work")),
        (_facts({"user": "bob"}), ("127.0.0.1", 2299, "bob", "/work")),
        (_facts({"user": "bob"}, user="bob"), ("127.0.0.1", 2299, "bob", "/work")),
        (_facts({"user": "bob"}, user="root"), ("127.0.0.1", 2299, "root", "/work")),
        (
            _facts({"network_mode": "bridge", "addresses": ("172.17.0.2", "10.0.0.9")}),
            ("172.17.0.2", 2299, "root", "/work"),
        ),
    ],
)
def test_a_running_container_with_its_sshd_routes_there(
    facts: RouteFacts, want: tuple[str, int, str, str]
) -> None:
    way = route(facts)
    assert isinstance(way, Sshd), way
    assert (way.address, way.port, way.user, way.workdir) == want
    assert way.host_key == KEY and way.container == facts.container
    assert str(way) == f"via the container's sshd ({want[0]}:{want[1]})"
