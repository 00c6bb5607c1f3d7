"""The pytest plugin is inert until asked, and its options collide with nothing.

Every pytest in an environment with this package loads the plugin (entry
point `pytest11`), CVS's runs included. These tests run on whatever pytest
is installed; CI runs them once more on the oldest pytest we claim
(`pytest>=8`, .ci/test), since pytest 9.2 refuses an option whose internal
name another plugin took and older ones did not.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.config.argparsing import Parser
from clitools import CVS
from clitools import cvs as run_cvs

from orchestrator import pytest_plugin
from orchestrator.compat.logs import DEMOTED_LOGGER, quiet_ssh_library

REPO = Path(__file__).resolve().parent.parent
STANDIN = Path(__file__).resolve().parent / "cvs_standin"

# What CVS's cvs/conftest.py registers, plus names a plugin of ours once used:
# no try/except here, so a collision is an error, not a silently lost option.
CONFTEST_WITH_CVS_OPTIONS = """\
def pytest_addoption(parser):
    parser.addoption("--cluster_file", action="store", required=True)
    parser.addoption("--config_file", action="store", required=True)
    parser.addoption("--cluster-file", action="store", dest="their_cluster_file")
    parser.addoption("--engine", action="store", default=None)
"""

TEST_READS_CVS_OPTIONS = """\
import sys


def test_options_reach_the_conftest(pytestconfig):
    assert pytestconfig.getoption("cluster_file") == "cluster.json"
    assert pytestconfig.getoption("config_file") == "config.json"
    assert pytestconfig.getoption("engine") == "theirs"


def test_the_plugin_loaded_no_ssh_stack():
    assert "asyncssh" not in sys.modules and "orchestrator.api" not in sys.modules
"""


def _pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_a_conftest_registering_cvs_options_keeps_them_with_our_plugin_loaded(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST_WITH_CVS_OPTIONS)
    (tmp_path / "test_cvs_like.py").write_text(TEST_READS_CVS_OPTIONS)
    proc = _pytest(
        tmp_path, "-q", "--cluster_file=cluster.json", "--config_file", "config.json",
        "--engine", "theirs",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout
    version = _pytest(tmp_path, "--version", "--version")
    assert "cvs-orchestrator" in version.stdout + version.stderr


@pytest.mark.filterwarnings("ignore::pytest.PytestDeprecationWarning")  # Parser() is private
def test_every_option_of_the_plugin_is_namespaced() -> None:
    parser = Parser()
    pytest_plugin.pytest_addoption(parser)
    options = [opt for group in parser._groups for opt in group.options]
    assert options
    for opt in options:
        assert all(name.startswith("--cvs-orchestrator") for name in opt.names()), opt.names()
        assert opt.dest.startswith("cvs_orchestrator"), opt.dest


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_loading_the_plugin_imports_only_pytest() -> None:
    probe = (
        "import sys, orchestrator.pytest_plugin; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('anyio', 'asyncssh', 'pydantic', 'rich', 'yaml')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_the_engine_flag_without_cvs_says_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    env_free = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('cvs') is None)"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    if env_free.stdout.strip() != "True":
        pytest.skip("CVS is importable here")
    proc = _pytest(tmp_path, "-q", "--cvs-orchestrator")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "install CVS in this environment" in proc.stdout + proc.stderr


# ---- `cvs run`: pytest starts in an interpreter with nothing of ours loaded --------------

# CVS's pytest.ini: a warning filter pytest cannot parse (BrokenPipeError is not
# a Warning). pytest reads the filters early only to report a module imported
# before it started; nothing of ours may be.
CVS_PYTEST_INI = """\
[pytest]
addopts = -p no:warnings
log_cli = true
filterwarnings =
    ignore::pytest.PytestUnraisableExceptionWarning
    ignore:.*Broken pipe.*:BrokenPipeError
"""

# Loaded by pytest while it reads its configuration (before any plugin's
# pytest_configure): what was imported by then is what pytest saw.
CONFTEST_RECORDING_ITS_INTERPRETER = """\
import json
import sys

with open("loaded.json", "w") as f:
    json.dump(sorted(m for m in sys.modules if m.split(".")[0] in ("orchestrator", "asyncssh")), f)


def pytest_addoption(parser):
    parser.addoption("--cluster_file")
    parser.addoption("--config_file")
"""


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_cvs_run_gives_pytest_an_interpreter_with_nothing_of_ours_loaded(
    tmp_path: Path,
) -> None:
    import asyncssh

    key = tmp_path / "id_ed25519"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    key.chmod(0o600)
    (tmp_path / "pytest.ini").write_text(CVS_PYTEST_INI)
    (tmp_path / "conftest.py").write_text(CONFTEST_RECORDING_ITS_INTERPRETER)
    (tmp_path / "suite_checks.py").write_text("def test_runs():\n    pass\n")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(
        json.dumps({"node_dict": {"10.0.0.1": {}}, "username": "u", "priv_key_file": str(key)})
    )
    (tmp_path / "config.json").write_text("{}")
    proc = run_cvs(
        "run", str(tmp_path / "suite_checks.py"),
        "--cluster_file", str(cluster), "--config_file", str(tmp_path / "config.json"),
        "--run-dir", str(tmp_path / "run"),
        cwd=tmp_path, timeout=300, ci=False,
        env={"PYTHONPATH": str(STANDIN)},  # CVS's factory, for the engine
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "while parsing the following warning configuration" not in proc.stderr
    assert "1 passed" in proc.stdout
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    # The plugin and the engine's hooks, which import only pytest: no SSH stack, no CLI.
    assert set(loaded) <= {
        "orchestrator",
        "orchestrator.compat",
        "orchestrator.compat.pytest_child",
        "orchestrator.compat.pytest_engine",
        "orchestrator.pytest_plugin",
    }, loaded


# ---- the SSH library's chatter under CVS's logging ---------------------------------------


def test_ssh_library_info_becomes_debug_and_warnings_stay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_ssh_library()
    ssh = logging.getLogger("asyncssh")
    with caplog.at_level(logging.INFO):
        ssh.info("[conn=0] Command: a whole shell program")
        ssh.warning("host key changed")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("asyncssh", "WARNING", "host key changed")
    ]
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        ssh.info("[conn=0] Opening SSH connection")
    assert [(r.name, r.levelname) for r in caplog.records] == [(DEMOTED_LOGGER, "DEBUG")]


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_ctrl_c_during_cvs_run_stops_pytest_and_records_the_interruption(
    tmp_path: Path,
) -> None:
    import signal
    import time

    import asyncssh

    key = tmp_path / "id_ed25519"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    key.chmod(0o600)
    (tmp_path / "conftest.py").write_text(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--cluster_file')\n"
        "    parser.addoption('--config_file')\n"
    )
    (tmp_path / "suite_sleeps.py").write_text(
        "import time\n\n\ndef test_sleeps():\n"
        "    open('started', 'w').close()\n"
        "    time.sleep(60)\n"
    )
    cluster = tmp_path / "cluster.json"
    cluster.write_text(
        json.dumps({"node_dict": {"10.0.0.1": {}}, "username": "u", "priv_key_file": str(key)})
    )
    (tmp_path / "config.json").write_text("{}")
    proc = subprocess.Popen(
        [*CVS, "run", str(tmp_path / "suite_sleeps.py"),
         "--cluster_file", str(cluster), "--config_file", str(tmp_path / "config.json"),
         "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(STANDIN)}, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out + err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["exit_code"] == 130
