"""Suite files: schema, one-line errors, lookup, and the pure step decisions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.config import ConfigError, parse_cluster
from orchestrator.results import HostResult
from orchestrator.suites.model import (
    Step,
    find_suite,
    list_suites,
    load_suite,
    looks_like_path,
    parse_suite,
)
from orchestrator.suites.records import StepHostOutcome
from orchestrator.suites.runner import judge, mpi_env, resolve_step_hosts, step_hosts

CLUSTER = parse_cluster(
    "name: lab\nhosts: ['node[1-4]']\n"
    "container: {image: 'img:1', name: c1, mpi: {slots: 2, hostfile: /etc/hf}}\n",
    "cluster.yaml",
    Path("/"),
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(text: str, source: str = "s.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_suite(text, source)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- schema -------------------------------------------------------------------


def test_minimal_suite_gets_step_defaults() -> None:
    suite = parse_suite("name: s\nsteps:\n  - {name: a, run: 'true'}\n", "s.yaml")
    step = suite.steps[0]
    assert (step.on, step.hosts, step.timeout, step.mpi) == ("container", "all", None, False)
    assert step.expect.exit_code == 0 and step.expect.stdout is None
    assert suite.source == "s.yaml"


def test_yaml_on_key_is_not_read_as_boolean() -> None:
    suite = parse_suite("name: s\nsteps:\n  - name: a\n    run: uname\n    on: host\n", "s.yaml")
    assert suite.steps[0].on == "host"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "name: s\nsteps:\n  - name: a\n    run: x\n    expect:\n      stdout: '(open'\n",
            "s.yaml:6: steps[0].expect.stdout: invalid regex '(open'",
            id="bad-stdout-regex-names-line-and-step",
        ),
        pytest.param(
            "name: s\nsteps:\n  - name: a\n    run: x\n    expect: {not_stdout: '['}\n",
            "steps[0].expect.not_stdout: invalid regex",
            id="bad-not-stdout-regex",
        ),
        pytest.param(
            "name: s\nsteps:\n  - name: a\n    run: x\n    timout: 3\n",
            "s.yaml:5: steps[0].timout: unknown key (did you mean 'timeout'?)",
            id="unknown-step-key-with-hint",
        ),
        pytest.param(
            "name: s\ndescripton: d\nsteps:\n  - {name: a, run: x}\n",
            "s.yaml:2: descripton: unknown key (did you mean 'description'?)",
            id="unknown-top-level-key",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x, expect: {exitcode: 1}}\n",
            "steps[0].expect.exitcode: unknown key (did you mean 'exit_code'?)",
            id="unknown-expect-key",
        ),
        pytest.param("name: s\nsteps: []\n", "steps: needs at least one entry", id="no-steps"),
        pytest.param("steps:\n  - {name: a, run: x}\n", "name: required key is missing", id="name"),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x, on: vm}\n",
            "steps[0].on: invalid value: expected 'container' or 'host'",
            id="bad-on",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x, timeout: 0}\n",
            "steps[0].timeout: must be greater than 0",
            id="zero-timeout",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: 'a b', run: x}\n",
            "steps[0].name: invalid step name 'a b'",
            id="step-name-must-be-a-file-name",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: '  '}\n", "steps[0].run: is empty", id="empty-run"
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x}\n  - {name: a, run: y}\n",
            "duplicate step name 'a'",
            id="duplicate-step",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x, mpi: true, on: host}\n",
            "an mpi step runs in the head container",
            id="mpi-on-host",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x, mpi: true, hosts: 'node2'}\n",
            "an mpi step runs once on the head container",
            id="mpi-with-hosts",
        ),
        pytest.param(
            "name: s\nsteps:\n  - {name: a, run: x, env: {1BAD: v}}\n",
            "invalid environment variable name '1BAD'",
            id="bad-env-name",
        ),
        pytest.param(
            "name: s\nsteps:\n  - name: a\n    run: [x\n",
            "s.yaml:4:10: the '[' opened on this line is never closed: end it with ']'",
            id="yaml-syntax-error-has-line-and-column",
        ),
        pytest.param(
            "name: s\nname: t\nsteps: []\n", "s.yaml:2:1: duplicate key 'name'", id="dup-key"
        ),
        pytest.param("", "s.yaml: expected a mapping", id="empty-file"),
        pytest.param("- a\n- b\n", "got a list", id="not-a-mapping"),
        pytest.param(
            "name: s\nsource: x\nsteps: []\n", "source: is set by the loader", id="source"
        ),
    ],
)
def test_malformed_suite_is_one_clear_line(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_error_in_a_later_step_names_that_step() -> None:
    text = "name: s\nsteps:\n  - {name: a, run: x}\n  - {name: check, run: y, hosts: 3}\n"
    message = error_of(text)
    assert message.startswith("s.yaml:4: steps[1].hosts: expected a string")
    assert message.endswith("(step 'check')")


def test_several_problems_reported_as_first_plus_count() -> None:
    text = "name: s\nsteps:\n  - {name: a, run: x, bogus: 1, other: 2}\n"
    assert "(and 1 more problem)" in error_of(text)


def test_load_suite_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_suite(tmp_path / "nope.yaml")


def test_load_suite_rejects_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: \xff\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_suite(path)


# ---- lookup -------------------------------------------------------------------


def test_shipped_examples_are_found_and_valid(tmp_path: Path) -> None:
    refs = {r.name: r for r in list_suites(cwd=tmp_path, env={})}
    assert {"install_demo", "test_demo"} <= set(refs)
    for name in ("install_demo", "test_demo"):
        assert refs[name].origin == "shipped"
        assert load_suite(refs[name].path).name == name


def test_lookup_order_is_local_then_path_env_then_shipped(tmp_path: Path) -> None:
    local = write(tmp_path / "suites" / "test_demo.yaml", "name: local\nsteps: []\n")
    first = write(tmp_path / "p1" / "test_demo.yml", "x")
    write(tmp_path / "p2" / "other.yaml", "x")
    env = {"CVS_SUITES_PATH": os.pathsep.join([str(tmp_path / "p1"), str(tmp_path / "p2")])}
    assert find_suite("test_demo", cwd=tmp_path, env=env).path == local
    local.unlink()
    ref = find_suite("test_demo", cwd=tmp_path, env=env)
    assert (ref.path, ref.origin) == (first, "$CVS_SUITES_PATH")
    assert find_suite("other", cwd=tmp_path, env=env).origin == "$CVS_SUITES_PATH"
    first.unlink()
    assert find_suite("test_demo", cwd=tmp_path, env=env).origin == "shipped"


def test_list_keeps_shadowed_suites_in_lookup_order(tmp_path: Path) -> None:
    write(tmp_path / "suites" / "install_demo.yaml", "x")
    refs = [r for r in list_suites(cwd=tmp_path, env={}) if r.name == "install_demo"]
    assert [r.origin for r in refs] == ["./suites", "shipped"]


def test_unknown_suite_names_every_place_looked(tmp_path: Path) -> None:
    env = {"CVS_SUITES_PATH": str(tmp_path / "extra")}
    with pytest.raises(ConfigError) as info:
        find_suite("tset_demo", cwd=tmp_path, env=env)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("unknown suite 'tset_demo': looked in ")
    assert str(tmp_path / "suites") in message and str(tmp_path / "extra") in message
    assert "shipped examples" in message and "did you mean 'test_demo'" in message


def test_a_path_is_loaded_as_given(tmp_path: Path) -> None:
    path = write(tmp_path / "x" / "mine.yaml", "name: mine\nsteps: [{name: a, run: b}]\n")
    ref = find_suite(str(path), cwd=tmp_path, env={})
    assert (ref.origin, ref.name) == ("path", "mine")
    with pytest.raises(ConfigError, match="no such file"):
        find_suite(str(tmp_path / "missing.yaml"), cwd=tmp_path, env={})


@pytest.mark.parametrize(
    ("arg", "is_path"),
    [("test_demo", False), ("./s.yaml", True), ("s.yml", True), ("dir/s", True)],
)
def test_names_and_paths_are_told_apart(arg: str, is_path: bool) -> None:
    assert looks_like_path(arg) is is_path


# ---- pure step decisions ------------------------------------------------------


def step(**kw: object) -> Step:
    return Step.model_validate({"name": "s", "run": "x", **kw})


@pytest.mark.parametrize(
    ("kw", "hosts"),
    [
        ({}, ["node1", "node2", "node3", "node4"]),
        ({"hosts": "head"}, ["node1"]),
        ({"hosts": "node[2-3]"}, ["node2", "node3"]),
        ({"hosts": "node4,node1"}, ["node1", "node4"]),
        ({"mpi": True}, ["node1"]),
    ],
)
def test_step_hosts(kw: dict[str, object], hosts: list[str]) -> None:
    assert step_hosts(step(**kw), CLUSTER) == hosts


def test_step_hosts_matching_nothing_is_a_config_error_naming_the_step() -> None:
    suite = parse_suite("name: s\nsteps:\n  - {name: a, run: x, hosts: gpu9}\n", "s.yaml")
    with pytest.raises(ConfigError, match=r"s.yaml: steps\[0\].hosts: 'gpu9' matches no host"):
        resolve_step_hosts(suite, CLUSTER)


def test_mpi_env_has_hostfile_hosts_and_rank_count() -> None:
    assert mpi_env(CLUSTER) == {
        "CVS_MPI_HOSTFILE": "/etc/hf",
        "CVS_MPI_HOSTS": "node1:2,node2:2,node3:2,node4:2",
        "CVS_MPI_NP": "8",
    }


def result(status: str = "ok", code: int | None = 0, out: str = "", **kw: object) -> HostResult:
    return HostResult(host="h", status=status, exit_code=code, stdout=out, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expect", "res", "status", "reason"),
    [
        ({}, result(), "ok", None),
        ({}, result("failed", 1), "failed", "exit 1, expected 0"),
        ({"exit_code": 3}, result("failed", 3), "ok", None),
        ({"exit_code": 3}, result(), "failed", "exit 0, expected 3"),
        ({"stdout": "^ok "}, result(out="x\nok node1\n"), "ok", None),
        ({"stdout": "^ok$"}, result(out="not ok\n"), "failed", "stdout did not match '^ok$'"),
        ({"not_stdout": "(?i)error"}, result(out="ERROR: x\n"), "failed", "stdout matched"),
        ({"not_stdout": "error"}, result(out="fine\n"), "ok", None),
        ({}, result("timeout", None, error="timed out"), "timeout", "timed out"),
        ({}, result("unreachable", None, error="refused"), "unreachable", "refused"),
        ({}, result("auth", None, error="denied"), "auth", "denied"),
        ({}, result("failed", None, error="signal"), "failed", "signal"),
    ],
)
def test_judge(expect: dict[str, object], res: HostResult, status: str, reason: str | None) -> None:
    judged = judge(step(expect=expect), res)
    assert judged.status == status
    if reason is None:
        assert judged.reason is None
    else:
        assert judged.reason is not None and reason in judged.reason


def test_judge_timeout_reason_names_the_limit() -> None:
    judged = judge(step(timeout=2.5), result("timeout", None))
    assert judged.reason == "timed out after 2.5s"


statuses = st.sampled_from(["ok", "failed", "timeout", "unreachable", "auth", "host_key"])


@given(
    status=statuses,
    code=st.one_of(st.none(), st.integers(-1, 255)),
    out=st.text(max_size=200),
    expected=st.integers(0, 3),
)
def test_judge_is_ok_only_when_the_command_ran_and_met_expect(
    status: str, code: int | None, out: str, expected: int
) -> None:
    judged: StepHostOutcome = judge(step(expect={"exit_code": expected}), result(status, code, out))
    assert judged.ok == (status in ("ok", "failed") and code == expected)
    assert judged.ok == (judged.reason is None)
    assert judged.host == "h"
    if status in ("timeout", "unreachable", "auth", "host_key"):
        assert judged.status == status


@given(out=st.text(max_size=200))
def test_stdout_and_not_stdout_of_one_regex_never_both_pass(out: str) -> None:
    both = step(expect={"stdout": "a+", "not_stdout": "a+"})
    assert not judge(both, result(out=out)).ok
