"""MPI's pure parts (issue 32): the hostfile's order and slots, the run-as-root
variables, what the head's check found, and the bad input `validate` refuses.
What crosses SSH runs on the sandbox in tests/test_mpi.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import cvs_in_process

from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec
from orchestrator.containers import mpi
from orchestrator.containers.argv import container_env
from orchestrator.containers.provision import mpi_check_argv
from orchestrator.suites.runner import mpi_env


def cluster(head: str | None = None, **container: object) -> ClusterConfig:
    hosts = [HostSpec(name=n, address=f"10.0.0.{i}") for i, n in enumerate(["a", "b", "c"], 1)]
    cfg = ContainerConfig(image="img:1", **container)  # type: ignore[arg-type]
    return ClusterConfig(hosts=hosts, head=head, container=cfg)


def test_hostfile_puts_the_head_first_then_the_cluster_order() -> None:
    assert mpi.hostfile_text(cluster(head="b"), 2) == "b slots=2\na slots=2\nc slots=2\n"


def test_slots_come_from_the_gpus_each_container_got_when_mpi_slots_is_unset() -> None:
    slots = mpi.host_slots(cluster(gpus={"count": 2}), {"a": 4, "b": 8})
    # c launched nowhere this time: the count the request guarantees.
    assert slots == {"a": 4, "b": 8, "c": 2}


def test_mpi_slots_wins_over_the_gpu_count() -> None:
    assert mpi.host_slots(cluster(mpi={"slots": 3}), {"a": 8}) == {"a": 3, "b": 3, "c": 3}


def test_without_gpus_or_mpi_slots_each_host_has_one_slot() -> None:
    assert mpi.host_slots(cluster()) == {"a": 1, "b": 1, "c": 1}


def test_mpi_env_follows_the_hostfile_read_in_the_head() -> None:
    found = mpi.parse_hostfile("/etc/cvs/hostfile", "a slots=4\nb slots=4\n# other\nc slots=2\n")
    assert mpi_env(cluster(), found) == {
        "CVS_MPI_HOSTFILE": "/etc/cvs/hostfile",
        "CVS_MPI_HOSTS": "a:4,b:4,c:2",
        "CVS_MPI_NP": "10",
    }


@pytest.mark.parametrize(
    ("user", "has_vars"),
    [(None, True), ("root", True), ("0", True), ("0:0", True), ("app", False), ("1000", False)],
)
def test_run_as_root_variables_go_where_commands_may_run_as_root(
    user: str | None, has_vars: bool
) -> None:
    env = container_env(ContainerConfig(image="img:1", user=user))
    assert ("OMPI_ALLOW_RUN_AS_ROOT" in env and "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM" in env) == has_vars


def test_container_env_overrides_the_run_as_root_variables() -> None:
    env = container_env(ContainerConfig(image="img:1", env={"OMPI_ALLOW_RUN_AS_ROOT": "0"}))
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "0"


def test_check_output_names_each_failed_peer_and_a_missing_mpirun() -> None:
    found = mpi.parse_mpi_check(
        "mpirun-missing\nhostfile a slots=1\npeer-ok b\n"
        "peer-fail c ssh: connect to host 10.0.0.3 port 2224: Connection refused\n"
    )
    assert found.peers_ok == ("b",)
    problems = found.problems("img:1", "a", 10)
    assert problems[0].startswith("image img:1 has no Open MPI: `mpirun` is not on the PATH")
    assert problems[1].startswith("c: its container's sshd did not answer `ssh c true`")
    assert "Connection refused" in problems[1]


def test_check_argv_refuses_a_peer_name_that_is_not_a_plain_name() -> None:
    with pytest.raises(ValueError, match="invalid peer name"):
        mpi_check_argv(["docker"], "box", 10, "/etc/cvs/hostfile", ["a;id"], need_mpirun=True)


def validate(tmp_path: Path, mpi_block: str, resources: str = "") -> tuple[int, str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "hosts: [a, b]\n"
        f"container:\n  image: img:1\n  mpi: {mpi_block}\n" + (f"  resources: {resources}\n")
    )
    proc = cvs_in_process("validate", "--no-check-files", cluster=path)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    ("mpi_block", "resources", "words"),
    [
        ("{slots: 0}", "{}", "mpi.slots must be at least 1, got 0"),
        ("{slots: 8}", "{cpus: 4}", "mpi.slots 8 is more than the container's CPUs"),
        ("{hostfile: etc/hostfile}", "{}", "mpi.hostfile must be an absolute path"),
        ("{hostfile: '/etc/a b'}", "{}", "mpi.hostfile must be an absolute path"),
    ],
)
def test_validate_refuses_bad_mpi_settings(
    tmp_path: Path, mpi_block: str, resources: str, words: str
) -> None:
    code, err = validate(tmp_path, mpi_block, resources)
    assert code == 2, err
    assert words in err
    assert len(err.strip().splitlines()) == 1, err


def test_validate_accepts_slots_within_the_cpus(tmp_path: Path) -> None:
    code, err = validate(tmp_path, "{slots: 4}", "{cpus: 4}")
    assert code == 0, err


def test_slots_above_a_host_cpu_count_are_named_at_up() -> None:
    (warning,) = mpi.slots_warnings(cluster(mpi={"slots": 8}), {"a": 16, "b": 4, "c": None})
    assert warning.startswith("mpi.slots 8 is more than the CPUs of b (b: 4)")
    capped = cluster(mpi={"slots": 2}, resources={"cpus": 2})
    assert mpi.slots_warnings(capped, {"a": 1}) == []  # resources.cpus decides (validate)


def test_a_peer_check_failure_next_to_a_container_off_the_host_network_names_its_mode() -> None:
    found = mpi.parse_mpi_check(
        "peer-fail node2 connect to host 10.0.0.2 port 2224: Network is unreachable\n"
    )
    (line,) = found.problems("img:1", "node1", 10, {"node1": "bridge", "node2": "host"})
    assert "node1's container is on network 'bridge', not the host's" in line
    assert "restarts a stopped sshd" not in line and "(container.network: host)" in line


def test_a_peer_check_failure_on_the_host_network_keeps_the_sshd_words() -> None:
    found = mpi.parse_mpi_check("peer-fail node2 Connection refused\n")
    (line,) = found.problems("img:1", "node1", 10, {"node1": "host", "node2": "host"})
    assert "restarts a stopped sshd" in line and "network" not in line.split("(")[0]


def test_a_peers_own_problem_is_the_line_without_its_name_in_front() -> None:
    # The peer's outcome takes `peer_problem` as data; `problems` names the peer.
    found = mpi.parse_mpi_check("peer-fail node2 Connection refused\n")
    own = found.peer_problem("node2", "Connection refused", "node1", 10)
    assert own.startswith("its container's sshd did not answer `ssh node2 true`")
    assert found.problems("img:1", "node1", 10) == [f"node2: {own}"]
