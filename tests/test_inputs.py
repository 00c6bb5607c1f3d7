"""Bad numbers, paths and names: exit 2, one line naming the option or key, no traceback.

Issue 14.4 (suite names are one path component) and 14.8 (NaN/inf/negative
timeouts and limits, --run-dir that is a file, under a file or not creatable).
Nothing here contacts a host: every case is refused before that.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clitools import cvs_in_process

from orchestrator.config import ConfigError
from orchestrator.suites.model import parse_suite

# Never contacted: every case below fails before any connection.
CLUSTER = "hosts: [{name: a, address: 192.0.2.1}]\ncontainer: {image: x, lifetime: per_run}\n"


def cvs_in(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cvs` in tmp_path on a cluster file naming a host nobody contacts (in this
    process: what is checked here is decided before any host is)."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    return cvs_in_process(*args, cluster=cluster, cwd=tmp_path)


def assert_one_line_exit_2(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, (fragment, proc.stderr)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "soon"])
def test_exec_timeout_that_is_not_a_finite_positive_number_exits_2(
    tmp_path: Path, value: str
) -> None:
    proc = cvs_in(tmp_path, "exec", f"--timeout={value}", "--", "true")
    assert_one_line_exit_2(proc, "--timeout", repr(value))


def test_run_dir_that_is_a_file_exits_2_and_writes_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "records"
    target.write_text("not a directory\n")
    proc = cvs_in(tmp_path, "run", "test_demo", "--run-dir", str(target))
    assert_one_line_exit_2(proc, str(target), "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "records"]


def test_run_dir_under_a_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    proc = cvs_in(tmp_path, "run", "test_demo", "--run-dir", str(tmp_path / "file" / "run"))
    assert_one_line_exit_2(proc, "file/run", "a parent of it is a file")


def test_run_dir_that_cannot_be_created_exits_2(tmp_path: Path) -> None:
    proc = cvs_in(tmp_path, "run", "test_demo", "--run-dir", "/proc/1/cvs-run")
    assert_one_line_exit_2(proc, "/proc/1/cvs-run", "cannot create it")


@pytest.mark.parametrize("name", ["x/../../../escaped", "..", ".", "a/b", "/abs", "ok\n", ""])
def test_suite_name_must_be_one_path_component(name: str) -> None:
    text = f"name: {name!r}\nsteps:\n  - {{name: a, run: 'true'}}\n".replace("'", '"')
    with pytest.raises(ConfigError) as info:
        parse_suite(text, "s.yaml")
    assert "s.yaml" in str(info.value) and "\n" not in str(info.value)


def test_suite_named_to_escape_runs_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "escape.yaml").write_text(
        'name: "x/../../../escaped"\nsteps:\n  - {name: a, run: "true"}\n'
    )
    proc = cvs_in(tmp_path, "run", "escape")
    assert_one_line_exit_2(proc, "invalid suite name")
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "escaped").exists()


def test_step_timeout_infinite_is_refused() -> None:
    with pytest.raises(ConfigError, match="finite"):
        parse_suite("name: s\nsteps:\n  - {name: a, run: x, timeout: .inf}\n", "s.yaml")


def test_address_with_a_port_is_parsed_and_the_connection_uses_that_port(tmp_path: Path) -> None:
    from orchestrator.config import parse_cluster
    from orchestrator.ssh.transport import SSHPool

    cluster = parse_cluster(
        "hosts:\n  - {name: n1, address: '127.0.0.1:2222'}\n  - {name: n6, address: '[::1]:2200'}\n"
        "ssh: {host_key_policy: 'off'}\n",
        "c.yaml",
        tmp_path,
    )
    n1, n6 = cluster.hosts
    assert (n1.address, n1.port) == ("127.0.0.1", 2222)
    assert (n6.address, n6.port) == ("::1", 2200)
    opts = SSHPool(cluster)._connect_options(n1)
    assert (opts["host"], opts["port"]) == ("127.0.0.1", 2222)
