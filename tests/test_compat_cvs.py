"""CVS's suites on our engine: shapes, config, the factory swap, `cvs run TEST`.

CVS is not on PyPI: tests/cvs_standin/ provides CVS's import paths (factory,
conftest options, the module-scoped `orch` fixture) and test modules written
the way CVS's suites are. The sandbox tests run them through `cvs run` and
plain pytest against real sshd and dockerd.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clitools import cvs as run_cvs
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli import main as cvs_main
from orchestrator.compat.config import (
    UNBOUNDED_COMMAND_TIMEOUT,
    cluster_from_cvs,
    cluster_from_files,
    cvs_container_name,
    keys_from_files,
)
from orchestrator.compat.cvs import CvsOrchestrator
from orchestrator.compat.pytest_engine import CvsEngine
from orchestrator.compat.records import pytest_exit_to_ours
from orchestrator.compat.runner import checked_pytest_args, find_cvs_test
from orchestrator.compat.shapes import (
    UNREACHABLE_MARK,
    cvs_shape,
    mpi_hostfile_text,
    mpirun_command,
)
from orchestrator.config import HOST_NAME_RE, ConfigError
from orchestrator.errors import UsageError
from orchestrator.results import HostResult
from orchestrator.sandbox import SSHD_TAG, Sandbox

REPO = Path(__file__).resolve().parent.parent
STANDIN = Path(__file__).resolve().parent / "cvs_standin"
log = logging.getLogger("test-compat")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CVS stand-in importable as `cvs` for one test."""
    monkeypatch.syspath_prepend(str(STANDIN))
    yield
    for name in [n for n in sys.modules if n == "cvs" or n.startswith("cvs.")]:
        del sys.modules[name]


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    import asyncssh

    path = tmp_path / "id_ed25519"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(path))
    path.chmod(0o600)
    return path


def cvs_keys(key_file: Path, **overrides: Any) -> dict[str, Any]:
    keys: dict[str, Any] = {
        "orchestrator": "container",
        "node_dict": {"10.0.0.1": {"vpc_ip": "192.168.0.1"}, "10.0.0.2": {}},
        "username": "alice",
        "priv_key_file": str(key_file),
        "password": None,
        "head_node_dict": {"mgmt_ip": "10.0.0.2"},
        "container": {"image": "rocm/cvs:latest", "enabled": True, "launch": True},
    }
    return {**keys, **overrides}


# ---- result shapes (pure) ---------------------------------------------------------


SHAPES = [
    (HostResult("h", "ok", 0, "out\n", "err\n"), "out\nerr\n", 0),
    (HostResult("h", "ok", 0, "no newline", ""), "no newline\n", 0),
    (HostResult("h", "failed", 3, "", "boom\n", error="exit code 3"), "boom\n", 3),
    (HostResult("h", "failed", 125, "", "container c is not running here\n"), None, 125),
    (HostResult("h", "timeout", None, "partial\n", error="timed out after 5s"), None, -1),
    (HostResult("h", "unreachable", error="connection refused"), None, -1),
    (HostResult("h", "host_key", error="host key mismatch"), None, -1),
    (HostResult("h", "auth", error="permission denied"), None, -1),
    (HostResult("h", "failed", None, "x\n", error="killed by signal 9"), None, -1),
    (HostResult("h", "ok", 0, "a\tb\n", "\tc"), "a   b\n   c\n", 0),
]


@pytest.mark.parametrize(("result", "output", "exit_code"), SHAPES)
def test_results_map_to_cvs_shapes(result: HostResult, output: str | None, exit_code: int) -> None:
    plain = cvs_shape({"h": result}, detailed=False)
    detailed = cvs_shape({"h": result}, detailed=True)
    assert detailed == {"h": {"output": plain["h"], "exit_code": exit_code}}
    if output is not None:
        assert plain["h"] == output
    assert plain["h"].startswith((result.stdout + result.stderr).replace("\t", "   "))


@pytest.mark.parametrize("status", ["unreachable", "auth", "host_key"])
def test_a_host_not_reached_says_why_then_ends_in_cvs_marker(status: str) -> None:
    # CVS: the exception's text, then "\nABORT: Host Unreachable Error" appended.
    out = cvs_shape({"h": HostResult("h", status, error="why not")}, detailed=False)  # type: ignore[arg-type]
    assert out["h"] == f"{status}: why not\n\n{UNREACHABLE_MARK}"


def test_timeout_gives_the_reason_first_then_cvs_marker_and_exit_minus_one() -> None:
    result = HostResult("h", "timeout", None, "partial\n", error="timed out after 5s")
    out = cvs_shape({"h": result}, detailed=True)["h"]
    assert out == {
        "output": "partial\ntimed out after 5s\nABORT: Timeout Error in Host: h\n",
        "exit_code": -1,
    }


# ---- the mpirun line (pure) -------------------------------------------------------


def test_mpi_hostfile_lists_each_host_with_its_slots() -> None:
    assert mpi_hostfile_text(["n1", "10.0.0.2"], 4) == "n1 slots=4\n10.0.0.2 slots=4\n"


@pytest.mark.parametrize(
    ("hosts", "ranks"), [([], 1), (["n1"], 0), (["n1"], True), (["n1; rm -rf /"], 1), (["a b"], 1)]
)
def test_mpi_hostfile_rejects_bad_input(hosts: list[str], ranks: int) -> None:
    with pytest.raises(ValueError):
        mpi_hostfile_text(hosts, ranks)


@given(st.text(max_size=30))
def test_mpi_hostfile_takes_only_host_names(host: str) -> None:
    if HOST_NAME_RE.fullmatch(host):
        assert mpi_hostfile_text([host], 1) == f"{host} slots=1\n"
    else:
        with pytest.raises(ValueError):
            mpi_hostfile_text([host], 1)


def test_mpirun_line_has_cvs_shape_without_disabling_host_keys() -> None:
    line = mpirun_command(
        "./rank --size 8",
        ranks=16,
        env_vars={"NCCL_DEBUG": "INFO"},
        mpi_install_dir="/opt/ompi/bin/",
        mpi_extra_args=["--mca", "btl ^openib"],
    )
    assert line == (
        "/opt/ompi/bin/mpirun --np 16 --allow-run-as-root --hostfile /tmp/mpi_hosts.txt "
        "--mca btl ^openib -x NCCL_DEBUG=INFO ./rank --size 8"
    )
    assert "StrictHostKeyChecking" not in line


@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=40))
def test_mpirun_env_values_arrive_as_one_argument(value: str) -> None:
    argv = shlex.split(mpirun_command("true", ranks=1, env_vars={"V": value}, mpi_install_dir="/m"))
    assert argv[argv.index("-x") + 1] == f"V={value}"


def test_mpirun_rejects_env_names_that_are_shell_text() -> None:
    with pytest.raises(ValueError, match="environment variable name"):
        mpirun_command("true", ranks=1, env_vars={"A;B": "x"}, mpi_install_dir="/m")


# ---- CVS config -> ours ---------------------------------------------------------------


def test_container_name_is_cvs_rule() -> None:
    assert cvs_container_name({"name": "mine"}, "rocm/cvs:latest") == "mine"
    user = os.environ.get("USER") or __import__("getpass").getuser()
    assert cvs_container_name({}, "rocm/cvs:7.0") == f"{user}_rocm_cvs_7_0"
    assert CvsOrchestrator.get_container_name({}, "a/b:c") == cvs_container_name({}, "a/b:c")


def test_cvs_keys_become_our_cluster(key_file: Path) -> None:
    cluster = cluster_from_cvs(cvs_keys(key_file))
    assert [h.name for h in cluster.hosts] == ["10.0.0.1", "10.0.0.2"]
    assert cluster.hosts[0].vpc_address == "192.168.0.1"
    # CVS's head is the first node_dict key, whatever head_node_dict says.
    assert cluster.head_host.name == "10.0.0.1"
    assert cluster.ssh.user == "alice"
    assert cluster.ssh.identity_files == [str(key_file)]
    assert cluster.ssh.command_timeout == UNBOUNDED_COMMAND_TIMEOUT
    assert cluster.container is not None
    assert cluster.container.lifetime == "persistent"
    assert cluster.container.name == cvs_container_name({}, "rocm/cvs:latest")


def test_baremetal_backend_has_no_container(key_file: Path) -> None:
    assert cluster_from_cvs(cvs_keys(key_file, orchestrator="baremetal")).container is None


def test_node_dict_as_a_list_of_mgmt_ips(key_file: Path) -> None:
    keys = cvs_keys(key_file, node_dict=[{"mgmt_ip": "n1"}, {"mgmt_ip": "n2", "vpc_ip": "v2"}])
    cluster = cluster_from_cvs(keys)
    assert [(h.name, h.vpc_address) for h in cluster.hosts] == [("n1", None), ("n2", "v2")]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"password": "hunter2"}, "password logins are not supported"),
        ({"orchestrator": "slurm"}, "'slurm' is not a backend"),
        ({"container": {}}, "container.image"),
        ({"username": None}, "username: required"),
        ({"container": {"image": "x:1", "launch": True, "lifetime": "per_run"}}, "lifetime"),
    ],
)
def test_bad_cvs_config_is_one_line_naming_the_key(
    key_file: Path, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        cluster_from_cvs(cvs_keys(key_file, **overrides))
    assert "\n" not in str(err.value)
    assert "hunter2" not in str(err.value)


def test_a_cvs_main_container_block_without_lifetime_is_per_run(key_file: Path) -> None:
    cluster = cluster_from_cvs(cvs_keys(key_file, container={"image": "x:1"}))
    assert cluster.container is not None and cluster.container.lifetime == "per_run"


@pytest.mark.parametrize("server", ["", None])
def test_an_empty_or_absent_registry_server_is_docker_hub_as_under_cvs(
    key_file: Path, server: str | None
) -> None:
    registry: dict[str, Any] = {"username": "me", "password_file": "/home/me/.token"}
    if server is not None:
        registry["server"] = server
    container = {"image": "x:1", "runtime": {"name": "docker", "args": {"registry": registry}}}
    cluster = cluster_from_cvs(cvs_keys(key_file, container=container))
    assert cluster.container is not None and cluster.container.registry is not None
    assert cluster.container.registry.server is None


def test_older_cvs_switches_are_read_with_a_note_that_cvs_main_refuses_them(
    key_file: Path,
) -> None:
    container = {"image": "x:1", "enabled": True, "launch": True}
    cluster = cluster_from_cvs(cvs_keys(key_file, container=container))
    assert any("CVS main refuses them" in note for note in cluster.cvs_notes)


def test_cvs_enabled_and_launch_mean_what_they_mean_under_cvs(key_file: Path) -> None:
    container = {"image": "x:1", "enabled": True, "launch": True}
    cluster = cluster_from_cvs(cvs_keys(key_file, container=container))
    assert cluster.container is not None and cluster.container.lifetime == "persistent"


def test_test_config_overrides_cluster_keys_and_our_sections_come_along(
    tmp_path: Path, key_file: Path
) -> None:
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(
        json.dumps(
            {
                **cvs_keys(key_file),
                "ssh": {"known_hosts": "known", "connect_timeout": 3},
                "name": "mi300",
            }
        )
    )
    config_file = tmp_path / "config.json"
    config_file.write_text(
        json.dumps({"container": {"image": "other:2", "enabled": True}, "rvs": {"path": "/x"}})
    )
    assert keys_from_files(str(cluster_file), str(config_file))["container"] == {
        "image": "other:2",
        "enabled": True,
    }
    cluster = cluster_from_files(str(cluster_file), str(config_file))
    assert cluster.name == "mi300"
    assert cluster.ssh.connect_timeout == 3
    assert cluster.ssh.known_hosts == str(tmp_path / "known")
    assert cluster.container is not None and cluster.container.image == "other:2"


# ---- the factory swap and finding tests (stand-in, in process) -----------------------


class _Config:
    def getoption(self, name: str, default: Any = None) -> Any:
        return default


def test_engine_makes_cvs_factory_return_ours_for_the_session(
    standin: None, key_file: Path
) -> None:
    from cvs.core.orchestrators.factory import OrchestratorConfig, OrchestratorFactory

    cfg = OrchestratorConfig(**cvs_keys(key_file))
    engine = CvsEngine()
    engine.pytest_configure(_Config())  # type: ignore[arg-type]
    try:
        orch = OrchestratorFactory.create_orchestrator(log, cfg)
        assert isinstance(orch, CvsOrchestrator)
        assert orch.hosts == ["10.0.0.1", "10.0.0.2"]
        assert orch.head_node == "10.0.0.1"
        assert orch.user == "alice"
        assert orch.orchestrator_type == "container"
        assert orch.container_config["image"] == "rocm/cvs:latest"
        assert orch.sudo_prefix() == ""
    finally:
        engine.pytest_unconfigure(_Config())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="stand-in CVS"):
        OrchestratorFactory.create_orchestrator(log, cfg)


def test_cvs_tests_are_found_in_the_cvs_tests_package(standin: None) -> None:
    path = find_cvs_test("compat_checks")
    assert path == STANDIN / "cvs" / "tests" / "compat" / "compat_checks.py"
    for not_a_test in ("conftest", "__init__"):
        with pytest.raises(UsageError, match="no CVS test module"):
            find_cvs_test(not_a_test)


def test_without_cvs_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cvs", None)
    with pytest.raises(UsageError, match="CVS is not importable here"):
        find_cvs_test("rvs_cvs")


def test_entry_point_for_cvs_factory_names_our_class() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["cvs.orchestrators"]["cvs-orchestrator"]
    module, _, name = target.partition(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    assert cls is CvsOrchestrator
    # CVS's factory calls backends as cls(log, config, stop_on_errors).
    params = list(inspect.signature(cls).parameters.values())[:3]
    assert [p.name for p in params] == ["log", "config", "stop_on_errors"]
    assert (
        "orchestrator.compat"
        in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )


@pytest.mark.parametrize(
    ("pytest_code", "refused", "unreachable", "ours"),
    [
        (0, None, False, 0),
        (1, None, False, 1),
        (1, None, True, 3),
        (1, "skew", False, 4),
        (2, None, False, 130),
        (4, None, False, 2),
        (5, None, False, 1),
    ],
)
def test_pytest_exit_status_maps_to_ours(
    pytest_code: int, refused: str | None, unreachable: bool, ours: int
) -> None:
    record = type("R", (), {"refused": refused, "unreachable": unreachable})()
    assert pytest_exit_to_ours(pytest_code, record) == ours  # type: ignore[arg-type]


# ---- `cvs run TEST` usage errors: exit 2, one line, nothing run ------------------------


def _files(tmp_path: Path, key_file: Path, **overrides: Any) -> tuple[Path, Path]:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(cvs_keys(key_file, **overrides)))
    config = tmp_path / "config.json"
    config.write_text("{}")
    return cluster, config


def _run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cvs_main(["run", *argv])
    return code, capfd.readouterr().err


def _run_checks(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path, *extra: str
) -> tuple[int, str]:
    """`cvs run compat_checks` on this test's cluster and config files, plus `extra`."""
    cluster, config = _files(tmp_path, key_file)
    return _run(
        capfd,
        "compat_checks",
        "--cluster_file", str(cluster), "--config_file", str(config),
        "--run-dir", str(tmp_path / "run"),
        *extra,
    )  # fmt: skip


def test_cvs_run_needs_both_files(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = _run(capfd, "rvs_cvs", "--cluster_file", str(tmp_path / "c.json"))
    assert code == 2
    assert "needs both --cluster_file and --config_file" in err


def test_cvs_run_bad_json_names_file_and_position(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "c.json"
    bad.write_text('{"node_dict": {,}}')
    code, err = _run(capfd, "rvs_cvs", "--cluster_file", str(bad), "--config_file", str(bad))
    assert code == 2
    assert err.count("\n") == 1 and f"{bad}:1:16: not valid JSON" in err


def test_cvs_run_unknown_test_names_where_it_looked(
    standin: None, capfd: pytest.CaptureFixture[str], tmp_path: Path, key_file: Path
) -> None:
    cluster, config = _files(tmp_path, key_file)
    code, err = _run(capfd, "nope", "--cluster_file", str(cluster), "--config_file", str(config))
    assert code == 2
    assert "no CVS test module nope.py under" in err and str(STANDIN) in err


def _no_pytest_html() -> None:
    if importlib.util.find_spec("pytest_html") is not None:
        pytest.skip("pytest-html is installed here")


@pytest.mark.parametrize("html", [["--html", "r.html"], ["--self-contained-html"]])
def test_cvs_run_html_without_pytest_html_says_what_to_install_and_runs_nothing(
    standin: None,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
    key_file: Path,
    html: list[str],
) -> None:
    _no_pytest_html()
    html = [str(tmp_path / a) if a.endswith(".html") else a for a in html]
    code, err = _run_checks(capfd, tmp_path, key_file, *html)
    assert code == 2
    assert err.count("\n") == 1 and f"cvs run {html[0]}: pytest-html is not installed" in err
    assert "pip install pytest-html" in err and "nothing was run" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("made_here", [True, False])
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_a_pytest_option_pytest_refuses_leaves_no_run_record(
    standin: None,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
    key_file: Path,
    made_here: bool,
) -> None:
    if not made_here:
        (tmp_path / "run").mkdir()  # a --run-dir the user made: kept, left empty
    code, err = _run_checks(capfd, tmp_path, key_file, "--no-such-pytest-option")
    assert code == 2, err
    assert "unrecognized arguments: --no-such-pytest-option" in err
    assert "pytest refused the arguments" in err and "nothing was run" in err
    if made_here:
        assert not (tmp_path / "run").exists()
    else:
        assert [p.name for p in (tmp_path / "run").iterdir()] == []


def test_yaml_suite_run_refuses_cvs_only_options(capfd: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capfd, "test_demo", "extra_function")
    assert code == 2 and "are for CVS tests" in err


def test_yaml_suite_run_names_arguments_it_does_not_know(
    capfd: pytest.CaptureFixture[str],
) -> None:
    code, err = _run(capfd, "test_demo", "--no-wiat")
    assert code == 2
    assert "unrecognized arguments: --no-wiat" in err and "pytest arguments are for CVS" in err


def test_other_commands_still_refuse_arguments_they_do_not_know(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        cvs_main(["validate", "-k", "name"])
    assert exc.value.code == 2
    assert "unrecognized arguments: -k name" in capfd.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--junitxml=elsewhere.xml"],
        ["--junit-xml", "elsewhere.xml"],
        ["--cluster_file=other.json"],
        ["--confcutdir=/"],
        ["--log-file=x.log"],
    ],
)
def test_cvs_run_refuses_pytest_options_it_sets_itself(
    standin: None,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
    key_file: Path,
    extra: list[str],
) -> None:
    code, err = _run_checks(capfd, tmp_path, key_file, "--", *extra)
    assert code == 2 and err.count("\n") == 1
    assert f"cvs run: {extra[0].split('=')[0]}:" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("bad", ["-k name", ["-k", "a\0b"], ["-x", 3]])
def test_pytest_arguments_are_argv_words(bad: Any) -> None:
    with pytest.raises(UsageError, match="argv word"):
        checked_pytest_args(bad)


# ---- CVS extensions' test directories -------------------------------------------------


@pytest.fixture
def extension(standin: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A CVS extension package `cvs_ext_demo`, named in $CVS_EXTENSION_PKG_NAMES as CVS
    reads it; its tests are in cvs_ext_demo/tests (the returned directory)."""
    site = tmp_path / "site"
    package = site / "cvs_ext_demo"
    tests = package / "tests"
    (tests / "health").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "extension.ini").write_text("[extensions]\ntests_dirs = cvs_ext_demo/tests\n")
    (tests / "health" / "ext_check.py").write_text("def test_ext():\n    pass\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("CVS_EXTENSION_PKG_NAMES", "cvs_ext_demo")
    yield tests


def test_cvs_tests_are_found_in_extension_test_directories(extension: Path) -> None:
    assert find_cvs_test("ext_check") == (extension / "health" / "ext_check.py").resolve()
    # CVS's own tests are still found alongside.
    assert find_cvs_test("compat_checks").parent.name == "compat"


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_cvs_run_by_name_runs_an_extension_test(
    extension: Path, tmp_path: Path, key_file: Path
) -> None:
    (extension / "conftest.py").write_text((STANDIN / "cvs" / "conftest.py").read_text())
    cluster, config = _files(tmp_path, key_file)
    env = {
        **_env(),
        "CVS_EXTENSION_PKG_NAMES": "cvs_ext_demo",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(STANDIN), str(tmp_path / "site")]),
    }
    proc = run_cvs(
        "--json", "run", "ext_check",
        "--cluster_file", str(cluster), "--config_file", str(config),
        "--run-dir", str(tmp_path / "run"),
        cwd=tmp_path, base_env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["test"] == "ext_check"
    assert "1 passed" in proc.stderr


def test_a_test_both_in_cvs_and_in_an_extension_is_refused_naming_both(
    extension: Path,
) -> None:
    (extension / "compat_checks.py").write_text("def test_shadow():\n    pass\n")
    with pytest.raises(UsageError, match="more than one place") as exc:
        find_cvs_test("compat_checks")
    assert str(STANDIN / "cvs" / "tests" / "compat" / "compat_checks.py") in str(exc.value)
    assert str((extension / "compat_checks.py").resolve()) in str(exc.value)
    assert "give the test file's path" in str(exc.value)


def test_unknown_test_lists_the_cvs_and_extension_directories_searched(
    extension: Path,
) -> None:
    with pytest.raises(UsageError) as exc:
        find_cvs_test("nope")
    text = str(exc.value)
    assert text.startswith("cvs run nope: no CVS test module nope.py under cvs.tests: ")
    assert str(STANDIN / "cvs" / "tests") in text
    assert f"cvs_ext_demo: {extension}" in text


def test_an_extension_test_directory_that_is_missing_says_so(
    extension: Path, tmp_path: Path
) -> None:
    ini = tmp_path / "site" / "cvs_ext_demo" / "extension.ini"
    ini.write_text("[extensions]\ntests_dirs = cvs_ext_demo/tests, cvs_ext_demo/gone\n")
    with pytest.raises(UsageError, match=r"cvs_ext_demo/gone \(missing\)"):
        find_cvs_test("nope")


def test_unknown_test_without_extensions_says_where_cvs_looks_for_them(
    standin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CVS_EXTENSION_PKG_NAMES", raising=False)
    with pytest.raises(UsageError, match=r"no CVS extensions found \(entry points") as exc:
        find_cvs_test("nope")
    assert "CVS_EXTENSION_PKG_NAMES" in str(exc.value)


def test_a_cvs_without_extension_support_has_its_own_tests_searched(
    standin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cvs.extension", None)  # a CVS from before extensions
    assert find_cvs_test("compat_checks").name == "compat_checks.py"


def test_a_failing_extension_discovery_is_named_not_a_traceback(
    standin: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cvs.extension

    def broken(self: Any) -> None:
        raise OSError("extension.ini: permission denied")

    monkeypatch.setattr(cvs.extension.ExtensionConfig, "__init__", broken)
    with pytest.raises(UsageError, match=r"extension discovery .* failed: OSError: ext"):
        find_cvs_test("compat_checks")


# ---- pytest arguments reach pytest (offline: no hosts needed) --------------------------

_TWO_TESTS = """\
def test_alpha():
    pass


def test_beta():
    pass
"""


@pytest.mark.parametrize(
    "extra",
    [
        ["-k", "alpha", "-x", "--maxfail", "1"],  # as under CVS: options cvs run does not know
        ["--", "-k", "alpha", "-v"],  # after --: -v is pytest's, not cvs's
    ],
    ids=["unknown-options", "after-double-dash"],
)
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_cvs_run_k_selects_the_tests_pytest_runs(
    tmp_path: Path, key_file: Path, extra: list[str]
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((STANDIN / "cvs" / "conftest.py").read_text())
    (suite / "two_checks.py").write_text(_TWO_TESTS)
    cluster, config = _files(tmp_path, key_file)
    proc = _cvs(
        "run", str(suite / "two_checks.py"),
        "--cluster_file", str(cluster), "--config_file", str(config),
        "--run-dir", str(tmp_path / "run"),
        *extra,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed, 1 deselected" in proc.stdout
    junit = (tmp_path / "run" / "junit.xml").read_text()
    assert 'name="test_alpha"' in junit and "test_beta" not in junit
    if "-v" in extra:
        assert "two_checks.py::test_alpha PASSED" in proc.stdout


# ---- on the sandbox: CVS-shaped suites, two `cvs run` invocations ---------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CVS_CLUSTER", "CVS_ENGINE")}
    return {**env, "PYTHONPATH": f"{REPO}{os.pathsep}{STANDIN}", "CI": "1"}


def _cvs(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_cvs(*args, cwd=cwd, base_env=_env(), timeout=timeout)


def cvs_cluster_json(
    sb: Sandbox,
    directory: Path,
    name: str,
    *,
    nodes: list[str],
    backend: str = "container",
    sshd_port: int = 2224,
) -> Path:
    """A CVS cluster JSON for sandbox nodes (addresses as node_dict keys, as CVS has them)."""
    doc: dict[str, Any] = {
        "_comment": "CVS cluster file; ssh/state_dir are cvs-orchestrator's own sections",
        "orchestrator": backend,
        "username": "cvs",
        "priv_key_file": str(sb.key_file),
        "node_dict": {n: {"bmc_ip": "NA", "vpc_ip": n} for n in nodes},
        "name": f"compat-{name}",
        "state_dir": str(directory / "state"),
        "ssh": {"known_hosts": str(sb.known_hosts), "use_ssh_config": False},
        "container": {
            "image": SSHD_TAG,
            "name": name,
            # CVS's switches: started if absent and kept between runs (persistent).
            "enabled": True,
            "launch": True,
            # Ours (CVS ignores it): clusters sharing sandbox hosts need their own port.
            "sshd": {"port": sshd_port},
            # Over CVS's defaults: this machine refuses --privileged and memlock above 8 MiB.
            "runtime": {
                "name": "docker",
                "args": {"privileged": False, "ulimit": ["memlock=8388608"]},
            },
        },
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


class CvsRuns:
    def __init__(self, directory: Path, cluster: Path, config: Path, token: str) -> None:
        self.directory, self.cluster, self.config, self.token = directory, cluster, config, token
        self.procs: dict[str, subprocess.CompletedProcess[str]] = {}

    def run(self, key: str, test: str, *extra: str) -> subprocess.CompletedProcess[str]:
        proc = _cvs(
            "run", test, *extra,
            "--cluster_file", str(self.cluster),
            "--config_file", str(self.config),
            "--run-dir", str(self.directory / key),
            cwd=self.directory,
        )  # fmt: skip
        self.procs[key] = proc
        return proc

    def results(self, key: str) -> dict[str, Any]:
        return json.loads((self.directory / key / "results.json").read_text())


@pytest.fixture(scope="module")
def cvs_runs(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CvsRuns]:
    """compat_install, then compat_checks in a second process, on persistent containers."""
    directory = tmp_path_factory.mktemp("cvs-compat")
    nodes = [h.address for h in sandbox.nodes[:3]]
    # Its own sshd port: other suites' containers may hold 2224 on the shared sandbox.
    cluster = cvs_cluster_json(sandbox, directory, "cvs-compat", nodes=nodes, sshd_port=2225)
    token = uuid.uuid4().hex
    config = directory / "compat_config.json"
    config.write_text(json.dumps({"compat": {"token": token}}))
    runs = CvsRuns(directory, cluster, config, token)
    try:
        runs.run("install", "compat_install")
        runs.run("checks", "compat_checks")
        runs.run("one", "compat_checks", "test_exec_on_head_runs_on_the_first_host")
        yield runs
    finally:
        _cvs("down", "-c", str(cluster), "--force", cwd=directory)


def test_install_run_cold_starts_and_passes(cvs_runs: CvsRuns) -> None:
    proc = cvs_runs.procs["install"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    doc = cvs_runs.results("install")
    assert {e["action"] for e in doc["plan"].values()} == {"cold_start"}
    assert doc["ok"] is True and doc["exit_code"] == 0
    assert doc["cluster"]["lifetime"] == "persistent"


def test_second_run_attaches_and_finds_the_install(cvs_runs: CvsRuns) -> None:
    proc = cvs_runs.procs["checks"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "12 passed" in proc.stdout
    doc = cvs_runs.results("checks")
    assert {e["action"] for e in doc["plan"].values()} == {"attach"}


def test_named_test_functions_run_alone(cvs_runs: CvsRuns) -> None:
    proc = cvs_runs.procs["one"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    names = [s["name"] for s in cvs_runs.results("one")["steps"]]
    # The orch fixture's set-up (in the first test's setup), then the test's one call.
    assert names == [
        "0001-test_exec_on_head_runs_on_the_first_host-setup_containers",
        "0002-test_exec_on_head_runs_on_the_first_host-setup_sshd",
        "0003-test_exec_on_head_runs_on_the_first_host-exec_on_head",
    ]


def test_run_dir_records_each_call_as_for_cvs_run(cvs_runs: CvsRuns) -> None:
    run_dir = cvs_runs.directory / "checks"
    doc = cvs_runs.results("checks")
    names = [s["name"] for s in doc["steps"]]
    # 0001/0002: the orch fixture's setup_containers and setup_sshd.
    assert names[:2] == [
        "0001-test_install_survived-setup_containers",
        "0002-test_install_survived-setup_sshd",
    ]
    assert all(h["status"] == "ok" for s in doc["steps"][:2] for h in s["hosts"].values())
    assert "0005-test_detailed_gives_output_and_exit_code-exec" in names
    step = doc["steps"][names.index("0005-test_detailed_gives_output_and_exit_code-exec")]
    assert {h["exit_code"] for h in step["hosts"].values()} == {3}
    assert step["continue_on_failure"] is True  # the suite judges, not the record
    log_dir = run_dir / "logs" / "0005-test_detailed_gives_output_and_exit_code-exec"
    assert sorted(p.name for p in log_dir.iterdir()) == sorted(
        f"{n}.log" for n in json.loads(cvs_runs.cluster.read_text())["node_dict"]
    )
    junit = (run_dir / "junit.xml").read_text()
    assert junit.count("<testcase") == 12
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = {e["event"] for e in events}
    assert {"CommandStarted", "CommandFinished", "Message"} <= kinds
    printed = cvs_runs.procs["checks"].stdout
    assert f"results:  {run_dir / 'results.json'}" in printed


def test_a_set_up_that_fails_is_in_results_json_with_the_host_and_the_error(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    nodes = [h.address for h in sandbox.nodes[:2]]
    cluster = cvs_cluster_json(sandbox, tmp_path, "cvs-compat-setupfail", nodes=nodes,
                               sshd_port=2227)  # fmt: skip
    script = tmp_path / "setup.sh"
    script.write_text("#!/bin/sh\necho 'no such package: rvs' >&2\nexit 7\n")
    doc = json.loads(cluster.read_text())
    doc["container"].update(lifetime="per_run", setup_script=str(script))
    del doc["container"]["enabled"], doc["container"]["launch"]
    cluster.write_text(json.dumps(doc))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"compat": {"token": "x"}}))
    runs = CvsRuns(tmp_path, cluster, config, "x")
    try:
        proc = runs.run("failed", "compat_install")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        results = runs.results("failed")
        assert results["error"].startswith(f"setup_containers failed on {nodes[0]}: provision")
        (setup,) = [s for s in results["steps"] if s["name"].endswith("-setup_containers")]
        for host in nodes:
            assert setup["hosts"][host]["status"] != "ok"
            assert "provision" in setup["hosts"][host]["reason"]
    finally:
        _cvs("down", "-c", str(cluster), "--force", cwd=tmp_path)


def test_container_cvs_started_is_refused_then_adopted_keeping_its_contents(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    nodes = sandbox.nodes[:2]
    name = "cvs-compat-foreign"
    cluster = cvs_cluster_json(
        sandbox, tmp_path, name, nodes=[h.address for h in nodes], sshd_port=2226
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"compat": {"token": "x"}}))
    started = []

    def docker(h: Any, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*sandbox.docker_argv(h.name), *argv], capture_output=True, text=True, timeout=60
        )

    try:
        for h in nodes:  # the way CVS starts its containers: no cvs labels
            run = ["run", "-d", "--name", name, "--network", "host", SSHD_TAG, "sleep", "inf"]
            assert docker(h, *run).returncode == 0
            started.append(h)
            assert docker(h, "exec", name, "sh", "-c", "echo cvs-made > /kept").returncode == 0
        runs = CvsRuns(tmp_path, cluster, config, "x")
        proc = runs.run("refused", "compat_install")
        assert proc.returncode == 4, proc.stdout + proc.stderr
        doc = runs.results("refused")
        assert doc["exit_code"] == 4 and doc["error"].startswith("refused:")
        for h in nodes:
            assert docker(h, "exec", name, "cat", "/kept").stdout == "cvs-made\n", h.name
        # The migration: adopt once with our CLI (it reads the CVS file), then run as usual.
        adopt = _cvs("up", "-c", str(cluster), "--adopt", cwd=tmp_path)
        assert adopt.returncode == 0, adopt.stdout + adopt.stderr
        proc = runs.run("adopted", "compat_install")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert {e["action"] for e in runs.results("adopted")["plan"].values()} == {"attach"}
        for h in nodes:
            assert docker(h, "exec", name, "cat", "/kept").stdout == "cvs-made\n", h.name
    finally:
        _cvs("down", "-c", str(cluster), "--force", cwd=tmp_path)
        for h in started:
            docker(h, "rm", "-f", name)


def test_no_limit_at_the_transport_outlives_the_default_limit(sandbox: Sandbox) -> None:
    # What timeout=None becomes (math.inf) against a 1s ssh.command_timeout; the
    # default and an explicit limit still stop the same command.
    import anyio

    from orchestrator.config import load_cluster
    from orchestrator.ssh.transport import SSHPool

    base = load_cluster(sandbox.cluster_file)
    config = base.model_copy(update={"ssh": base.ssh.model_copy(update={"command_timeout": 1.0})})
    host = config.hosts[0].name

    async def main() -> list[HostResult]:
        async with SSHPool(config) as pool:
            return [
                await pool.run(host, ["sleep", "2"], timeout=math.inf),
                await pool.run(host, ["sleep", "2"]),
                await pool.run(host, ["sleep", "2"], timeout=0.5),
            ]

    unbounded, default, explicit = anyio.run(main)
    assert unbounded.status == "ok" and unbounded.duration >= 2, unbounded
    assert default.status == "timeout" and "after 1s" in (default.error or "")
    assert explicit.status == "timeout" and "after 0.5s; remote process killed" in (
        explicit.error or ""
    )


def test_plain_pytest_with_engine_flag_reports_an_unreachable_host(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    alive = [h.address for h in sandbox.nodes[:2]]
    # An address on the sandbox's own bridge that no host has.
    dead = alive[0].rsplit(".", 1)[0] + ".250"
    cluster = cvs_cluster_json(
        sandbox, tmp_path, "unused", nodes=[*alive, dead], backend="baremetal"
    )
    doc = json.loads(cluster.read_text())
    doc["ssh"].update(connect_timeout=3, connect_retries=0)
    cluster.write_text(json.dumps(doc))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"compat": {"unreachable": dead}}))
    test = STANDIN / "cvs" / "tests" / "compat" / "compat_unreachable.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", str(test), "--cvs-orchestrator",
         "--cluster_file", str(cluster), "--config_file", str(config),
         f"--confcutdir={STANDIN}", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
    # Opted in from pytest, the engine writes its run records too.
    (run_dir,) = (tmp_path / "runs").glob("*-compat_unreachable")
    assert f"cvs-orchestrator run records: runs/{run_dir.name}" in proc.stdout
    doc = json.loads((run_dir / "results.json").read_text())
    assert doc["ok"] is True and doc["suite"]["name"] == "compat_unreachable"
    dead_results = [s["hosts"][dead] for s in doc["steps"] if dead in s["hosts"]]
    assert dead_results and all(r["status"] == "unreachable" for r in dead_results)


class _EngineConfig:
    def __init__(self, engine: bool) -> None:
        self.engine = engine

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.engine if name == "cvs_orchestrator_engine" else default


@pytest.mark.parametrize(
    ("flag", "env", "wanted"),
    [
        (False, None, False),
        (True, None, True),
        (False, "cvs-orchestrator", True),
        (False, "some-other-backend", False),  # CVS's own entry-point lookup, not ours
    ],
)
def test_engine_is_opt_in_by_flag_or_environment(
    monkeypatch: pytest.MonkeyPatch, flag: bool, env: str | None, wanted: bool
) -> None:
    from orchestrator.compat.pytest_engine import engine_requested

    monkeypatch.delenv("CVS_ENGINE", raising=False)
    if env is not None:
        monkeypatch.setenv("CVS_ENGINE", env)
    assert engine_requested(_EngineConfig(flag)) is wanted  # type: ignore[arg-type]


def test_a_host_outside_the_cluster_is_in_the_result_saying_why(key_file: Path) -> None:
    from types import SimpleNamespace

    orch = CvsOrchestrator(log, SimpleNamespace(**cvs_keys(key_file)))
    try:
        out = orch.exec("true", hosts=["10.9.9.9"], detailed=True, print_console=False)
    finally:
        orch.close()
    assert out == {
        "10.9.9.9": {
            "output": "unreachable: '10.9.9.9' is not a host of the "
            f"cluster file (not in node_dict)\n\n{UNREACHABLE_MARK}",
            "exit_code": -1,
        }
    }


class _TimeoutProbe:
    """In place of the loop and Cluster: records the time limit each command gets."""

    def __init__(self) -> None:
        self.limits: list[float | None] = []

    def call(self, func: Any) -> Any:
        import anyio

        return anyio.run(func)

    async def exec(
        self, command: Any, *, hosts: list[str], timeout: float | None, host_os: bool
    ) -> dict[str, HostResult]:
        self.limits.append(timeout)
        return {h: HostResult(h, "ok", 0, "", "") for h in hosts}


def _probed(key_file: Path, tmp_path: Path, **native: Any) -> tuple[CvsOrchestrator, _TimeoutProbe]:
    from types import SimpleNamespace

    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({**cvs_keys(key_file), **native}))
    orch = CvsOrchestrator(log, SimpleNamespace(**cvs_keys(key_file)), cluster_file=str(cluster))
    probe = _TimeoutProbe()
    orch._fleet = lambda: (probe, probe)  # type: ignore[method-assign,assignment,return-value]
    return orch, probe


def test_timeout_none_means_no_limit_as_under_cvs(key_file: Path, tmp_path: Path) -> None:
    orch, probe = _probed(key_file, tmp_path)
    orch.exec("true", print_console=False)
    orch.exec_on_head("true", print_console=False)
    orch.exec_on_host("true", print_console=False)
    orch.all.exec("true", print_console=False)
    orch.exec_cmd_list(["true", "false"], print_console=False)  # one command per host
    assert probe.limits == [math.inf] * 6


def test_an_explicit_timeout_is_the_limit(key_file: Path, tmp_path: Path) -> None:
    orch, probe = _probed(key_file, tmp_path)
    orch.exec("true", timeout=5, print_console=False)
    orch.head.exec("true", timeout=0.5, print_console=False)
    assert probe.limits == [5.0, 0.5]


def test_timeout_none_keeps_the_cap_the_cluster_file_sets(key_file: Path, tmp_path: Path) -> None:
    orch, probe = _probed(key_file, tmp_path, ssh={"command_timeout": 30})
    orch.exec("true", print_console=False)
    assert probe.limits == [30.0]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "10", True])
def test_a_timeout_that_is_not_a_positive_number_runs_nothing(
    key_file: Path, tmp_path: Path, bad: Any
) -> None:
    orch, probe = _probed(key_file, tmp_path)
    with pytest.raises(ValueError, match="timeout: a positive number of seconds or None"):
        orch.exec("true", timeout=bad, print_console=False)
    assert probe.limits == []


def test_exec_cmd_list_needs_one_command_per_host(key_file: Path) -> None:
    from types import SimpleNamespace

    orch = CvsOrchestrator(log, SimpleNamespace(**cvs_keys(key_file)))
    with pytest.raises(ValueError, match="one command per host: got 1 command"):
        orch.exec_cmd_list(["true"])
    orch.close()


def test_cvs_json_with_our_sections_loads_through_the_cli(
    tmp_path: Path, key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "cluster.json"
    doc = {**cvs_keys(key_file), "ssh": {"host_key_policy": "accept-new"}, "limits": {}}
    cluster.write_text(json.dumps(doc))
    assert cvs_main(["validate", "-c", str(cluster), "--no-check-files"]) == 0
    assert "accept-new" in capsys.readouterr().out
    doc["ssh"] = {"user": "bob"}
    cluster.write_text(json.dumps(doc))
    assert cvs_main(["validate", "-c", str(cluster), "--no-check-files"]) == 2
    assert "ssh.user: conflicts with username" in capsys.readouterr().err


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_cvs_run_of_a_test_file_path_with_json_summary(tmp_path: Path, key_file: Path) -> None:
    # A CVS-style test file given by path, with its own conftest for the two options;
    # it does not touch the cluster, so no hosts are needed.
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((STANDIN / "cvs" / "conftest.py").read_text())
    (suite / "offline_checks.py").write_text(
        "def test_passes(pytestconfig):\n"
        "    assert pytestconfig.getoption('config_file').endswith('config.json')\n"
    )
    cluster, config = _files(tmp_path, key_file)
    proc = _cvs(
        "--json", "run", str(suite / "offline_checks.py"),
        "--cluster_file", str(cluster), "--config_file", str(config),
        "--run-dir", str(tmp_path / "run"),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)  # stdout is the JSON line alone
    assert doc["ok"] is True and doc["test"] == "offline_checks"
    assert "1 passed" in proc.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["exit_code"] == 0 and results["steps"] == []
    assert (tmp_path / "run" / "junit.xml").read_text().count("<testcase") == 1


# ---- one `cvs` for both: which forms go to CVS's CLI (pure) ---------------------------


@pytest.mark.parametrize(
    ("argv", "to_cvs"),
    [
        (["list"], True),
        (["generate", "plugin", "x"], True),
        (["copy-config", "--all"], True),
        (["scp", "--src", "a"], True),
        (["monitor"], True),
        (["exec", "--cmd", "hostname", "--cluster_file", "c.json"], True),
        (["exec", "--cmd=hostname"], True),
        (["exec", "--", "hostname"], False),  # ours: cvs exec CMD
        (["run", "rvs_cvs", "--cluster_file", "c", "--config_file", "t"], False),  # ours
        (["status"], False),
        (["--help"], False),
        ([], False),
        (["nonsense"], False),  # not CVS's either: our parser says so
    ],
)
def test_cvs_own_command_forms_go_to_cvs_cli_and_ours_stay(argv: list[str], to_cvs: bool) -> None:
    from orchestrator.cli import _our_commands
    from orchestrator.cli.cvs_cli import wants_cvs_cli

    assert wants_cvs_cli(argv, _our_commands()) is to_cvs


# ---- CVS's container accessors and get_mpi_command (no hosts needed) -----------------------


def test_container_accessors_say_what_our_containers_get_and_never_the_ssh_mount(
    key_file: Path,
) -> None:
    from types import SimpleNamespace

    args = {"volumes": ["/data:/data:ro"], "ulimit": ["nofile=1024"], "privileged": False}
    container = {"image": "x:1", "lifetime": "per_run", "runtime": {"name": "docker", "args": args}}
    orch = CvsOrchestrator(log, SimpleNamespace(**cvs_keys(key_file, container=container)))
    try:
        assert orch.get_volumes() == ["/data:/data:ro"]  # no ~/.ssh:/host_ssh: keys stay out
        assert "/dev/kfd" in orch.get_devices() and "SYS_ADMIN" in orch.get_capabilities()
        assert "nofile=1024" in orch.get_ulimits() and "memlock=-1" in orch.get_ulimits()
        assert orch.is_privileged() is False
        assert (orch.get_network_mode(), orch.get_ipc_mode()) == ("host", "host")
        assert "video" in orch.get_groups() and orch.get_security_opts()
        line = orch.get_mpi_command("rank.sh", ["--np", "4"], {"V": "a b"}, "/opt/mpi/bin")
        assert line == "/opt/mpi/bin/mpirun --np 4 -x 'V=a b' rank.sh"
        assert "StrictHostKeyChecking" not in line
        with pytest.raises(RuntimeError, match="Call setup_containers"):
            orch.setup_sshd()
    finally:
        orch.close()
