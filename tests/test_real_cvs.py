"""The real CVS (AMD's cluster validation suite), unchanged, next to this project.

CVS is not on PyPI; `../shared/peers/cvs-main-dddd9143.tar.gz` (see its
README) is the public repository at one commit. These tests unpack it once
per session into a venv of its own (CVS and its requirements, then this
project), and skip with that reason when the file is absent (a fresh clone).

CVS's workloads need GPUs and the internet, so on the sandbox they fail
inside the tests with CVS's own messages: what is asserted is the
orchestrator's part (set-up, attach to the same containers, result shapes,
records, exit codes), never that RVS passed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.sandbox import SSHD_TAG, Sandbox

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO.parent / "shared" / "peers"
CVS_TARBALL = PEERS / "cvs-main-dddd9143.tar.gz"
CVS_TREE = "cvs-main-dddd9143"
RVS_CONFIG = Path("cvs/input/config_file/health/mi300_health_config.json")
VLLM_CONFIG = Path("cvs/input/config_file/inference/vllm/mi300x_vllm_llama31-70b_fp8_single.json")
UNREACHABLE = "ABORT: Host Unreachable Error"

# Every test here installs the real CVS in venvs of its own (the package index,
# about a minute) and most drive the sandbox: none belongs in the fast subset.
pytestmark = pytest.mark.sandbox


def _env(**extra: str) -> dict[str, str]:
    drop = ("CVS_CLUSTER", "CVS_ENGINE", "PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "CI": "1", **extra}


def _run(
    argv: list[str | Path], *, cwd: Path, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _unittest_summary(out: str) -> tuple[int, str]:
    """("Ran N tests", the verdict line) of a unittest run."""
    ran = re.search(r"^Ran (\d+) tests? in", out, re.M)
    verdict = re.findall(r"^(OK.*|FAILED \(.*\))$", out, re.M)
    assert ran and verdict, out[-2000:]
    return int(ran.group(1)), verdict[-1]


def _pytest_counts(out: str) -> str:
    """pytest's last summary line, without the time (`12 passed, 1 failed`)."""
    lines = [x for x in out.splitlines() if re.search(r"\d+ (passed|failed|error)", x)]
    assert lines, out[-2000:]
    return re.sub(r" in [\d.]+s.*$", "", lines[-1].strip("= "))


@dataclass
class RealCvs:
    tree: Path
    bin: Path
    # CVS on its own, before this project was installed into the venv.
    alone_unittests: tuple[int, str]
    alone_pytest: str

    @property
    def python(self) -> Path:
        return self.bin / "python"


# pytest over CVS's own orchestrator unit tests: CVS's conftest requires its two
# options, which is what a colliding plugin option takes away (pytest 9.2).
CVS_PYTEST_ARGS = [
    "-q", "-p", "no:cacheprovider", "cvs/core/orchestrators/unittests",
    "--cluster_file=cluster.json", "--config_file=config.json",
]  # fmt: skip


def _build_real_cvs(root: Path, *pins: str) -> RealCvs:
    """CVS unpacked and installed into a venv of its own (with `pins`, e.g. an
    older pytest); its unit tests run before this project joins the venv."""
    with tarfile.open(CVS_TARBALL) as tar:
        tar.extractall(root, filter="data")
    tree = root / CVS_TREE
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # --no-compile: byte-compiling all of pandas and matplotlib up front was
    # 40% of pip's CPU time; Python compiles what the tests import, when they do.
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile"]
    done = _run([*pip, "-e", tree, *pins], cwd=root, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    alone_unit = _run([venv / "bin" / "python", "run_all_unittests.py"], cwd=tree)
    alone_pytest = _run([venv / "bin" / "python", "-m", "pytest", *CVS_PYTEST_ARGS], cwd=tree)
    done = _run([*pip, "-e", REPO, *pins], cwd=root, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return RealCvs(
        tree=tree,
        bin=venv / "bin",
        alone_unittests=_unittest_summary(alone_unit.stderr),
        alone_pytest=_pytest_counts(alone_pytest.stdout),
    )


def _skip_without_peers() -> None:
    if not CVS_TARBALL.is_file():
        pytest.skip(f"{PEERS}/ absent: the real CVS ({CVS_TARBALL.name}) is not on this machine")


@pytest.fixture(scope="session")
def real_cvs_builds(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[RealCvs]]]:
    """Both venvs, built at once in two threads when the first is asked for:
    each is mostly pip and CVS's own tests in subprocesses (over a minute), so
    the second no longer waits for the first. Teardown waits for both."""
    _skip_without_peers()
    newest = tmp_path_factory.mktemp("real-cvs")
    oldest = tmp_path_factory.mktemp("real-cvs-pytest8")
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="real-cvs") as pool:
        yield {
            "newest": pool.submit(_build_real_cvs, newest),
            "pytest8": pool.submit(_build_real_cvs, oldest, "pytest==8.0.*"),
        }


@pytest.fixture(scope="session")
def real_cvs(real_cvs_builds: dict[str, Future[RealCvs]]) -> RealCvs:
    """CVS and this project on the newest pytest the pins allow (once per session)."""
    return real_cvs_builds["newest"].result()


@pytest.fixture(scope="session")
def real_cvs_pytest8(real_cvs_builds: dict[str, Future[RealCvs]]) -> RealCvs:
    """The same on pytest 8.0, the oldest this project claims (`pytest>=8`)."""
    return real_cvs_builds["pytest8"].result()


# ---- stock CVS, this project installed and not asked for --------------------------------


def test_cvs_unit_tests_give_the_same_counts_with_this_project_installed(
    real_cvs: RealCvs,
) -> None:
    proc = _run([real_cvs.python, "run_all_unittests.py"], cwd=real_cvs.tree)
    assert _unittest_summary(proc.stderr) == real_cvs.alone_unittests


def test_cvs_options_survive_our_pytest_plugin_under_pytest_of_the_venv(
    real_cvs: RealCvs,
) -> None:
    # Before the fix, pytest 9.2 refused CVS's --cluster_file (our --cluster-file
    # had taken its internal name) and every CVS run was "unrecognized arguments".
    proc = _run([real_cvs.python, "-m", "pytest", *CVS_PYTEST_ARGS], cwd=real_cvs.tree)
    assert "unrecognized arguments" not in proc.stdout + proc.stderr
    assert _pytest_counts(proc.stdout) == real_cvs.alone_pytest


def test_on_pytest_8_cvs_counts_are_the_same_with_this_project_installed(
    real_cvs_pytest8: RealCvs,
) -> None:
    cvs = real_cvs_pytest8
    version = _run([cvs.python, "-m", "pytest", "--version"], cwd=cvs.tree)
    assert "pytest 8.0." in version.stdout + version.stderr
    proc = _run([cvs.python, "-m", "pytest", *CVS_PYTEST_ARGS], cwd=cvs.tree)
    assert _pytest_counts(proc.stdout) == cvs.alone_pytest
    unit = _run([cvs.python, "run_all_unittests.py"], cwd=cvs.tree)
    assert _unittest_summary(unit.stderr) == cvs.alone_unittests


def test_cvs_commands_we_do_not_have_reach_cvs_cli_unchanged(real_cvs: RealCvs) -> None:
    # `cvs` is ours (installed last); `cvs list` is CVS's command, shown as CVS shows it.
    ours = _run([real_cvs.bin / "cvs", "list"], cwd=real_cvs.tree)
    cvs = _run([real_cvs.python, "-m", "cvs.main", "list"], cwd=real_cvs.tree)
    assert ours.returncode == cvs.returncode == 0, ours.stderr
    assert ours.stdout == cvs.stdout and "rvs_cvs" in ours.stdout
    helped = _run([real_cvs.bin / "cvs", "--help"], cwd=real_cvs.tree)
    assert "go to CVS's own CLI" in helped.stdout and "copy-config" in helped.stdout


def test_cvs_exec_cmd_form_goes_to_cvs_and_ours_stays_ours(
    real_cvs: RealCvs, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-cluster.json"
    theirs = _run([real_cvs.bin / "cvs", "exec", "--cmd", "true", "--cluster_file", missing],
                  cwd=tmp_path)  # fmt: skip
    direct = _run([real_cvs.python, "-m", "cvs.main", "exec", "--cmd", "true",
                   "--cluster_file", missing], cwd=tmp_path)  # fmt: skip
    assert (theirs.returncode, theirs.stdout, theirs.stderr) == (
        direct.returncode, direct.stdout, direct.stderr,
    )  # fmt: skip
    ours = _run([real_cvs.bin / "cvs", "exec", "--help"], cwd=tmp_path)
    assert ours.returncode == 0 and "--host-os" in ours.stdout


# ---- on the sandbox: CVS's own suites on this engine --------------------------------------


def _cluster_json(
    sb: Sandbox,
    directory: Path,
    name: str,
    *,
    nodes: list[str],
    lifetime: str | None = "persistent",
    backend: str = "container",
    sshd_port: int = 2231,
) -> Path:
    """A CVS main cluster file for sandbox nodes, plus our own sections CVS ignores."""
    container: dict[str, Any] = {
        "image": SSHD_TAG,
        "name": name,
        # Ours: clusters sharing sandbox hosts need their own sshd port.
        "sshd": {"port": sshd_port},
        # Over CVS's defaults: this machine refuses --privileged and memlock above 8 MiB.
        "runtime": {
            "name": "docker",
            "args": {"privileged": False, "ulimit": ["memlock=8388608"]},
        },
    }
    if lifetime is not None:
        container["lifetime"] = lifetime
    doc = {
        "orchestrator": backend,
        "username": "cvs",
        "priv_key_file": str(sb.key_file),
        "node_dict": {n: {"bmc_ip": "NA", "vpc_ip": n} for n in nodes},
        "name": f"realcvs-{name}",
        "state_dir": str(directory / "state"),
        "ssh": {"known_hosts": str(sb.known_hosts), "use_ssh_config": False},
        "container": container,
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def _rvs_config(real_cvs: RealCvs, directory: Path) -> Path:
    """CVS's health config with its <changeme> placeholders filled in."""
    text = (real_cvs.tree / RVS_CONFIG).read_text().replace("<changeme>", "/opt/rocm")
    path = directory / "rvs_config.json"
    path.write_text(text)
    return path


def _container_ids(sb: Sandbox, hosts: list[str], name: str) -> dict[str, str]:
    found = {}
    for node in sb.nodes:
        if node.address not in hosts:
            continue
        argv = [*sb.docker_argv(node.name), "ps", "-aq", "--no-trunc", "--filter", f"name=^{name}$"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        if out.stdout.strip():
            found[node.address] = out.stdout.strip()
    return found


def _junit_outcomes(path: Path) -> dict[str, str]:
    """test name (parameters dropped) -> passed / failed / skipped, from pytest's junit.xml."""
    import xml.etree.ElementTree as ET

    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]
        kinds = {child.tag for child in case}
        outcome = (
            "failed"
            if kinds & {"failure", "error"}
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
        out.setdefault(name, outcome)
    return out


def _setup_step(doc: dict[str, Any]) -> dict[str, Any]:
    steps = [s for s in doc["steps"] if s["name"].endswith("-setup_containers")]
    assert steps, [s["name"] for s in doc["steps"]]
    return dict(steps[0]["hosts"])


@dataclass
class RvsRuns:
    directory: Path
    cluster: Path
    config: Path
    hosts: list[str]
    name: str
    procs: dict[str, subprocess.CompletedProcess[str]]
    ids: dict[str, dict[str, str]]

    def results(self, key: str) -> dict[str, Any]:
        return dict(json.loads((self.directory / key / "results.json").read_text()))

    def pytest_records(self, key: str) -> dict[str, Any]:
        """results.json of a run opted in from pytest (records under CWD/runs/)."""
        (run_dir,) = (self.directory / key / "runs").glob("*-rvs_cvs")
        return dict(json.loads((run_dir / "results.json").read_text()))


@pytest.fixture(scope="module")
def rvs_runs(
    real_cvs: RealCvs, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RvsRuns]:
    """install_rvs, then rvs_cvs the three ways in, on one persistent set of 2 hosts."""
    directory = tmp_path_factory.mktemp("real-cvs-rvs")
    hosts = [h.address for h in sandbox.nodes[:2]]
    name = f"realcvs-{uuid.uuid4().hex[:6]}"
    cluster = _cluster_json(sandbox, directory, name, nodes=hosts)
    config = _rvs_config(real_cvs, directory)
    files = ["--cluster_file", str(cluster), "--config_file", str(config)]
    runs = RvsRuns(directory, cluster, config, hosts, name, {}, {})
    python = real_cvs.python
    try:
        # 1. our command, as docs/coming-from-cvs.md's first CVS command.
        runs.procs["install"] = _run(
            [python, "-m", "orchestrator", "run", "install_rvs", *files,
             "--run-dir", directory / "install"], cwd=real_cvs.tree)  # fmt: skip
        runs.ids["install"] = _container_ids(sandbox, hosts, name)
        runs.procs["rvs"] = _run(
            [real_cvs.bin / "cvs", "run", "rvs_cvs", *files, "--run-dir", directory / "rvs"],
            cwd=real_cvs.tree,
        )
        runs.ids["rvs"] = _container_ids(sandbox, hosts, name)
        # 2. plain pytest with CVS's pytest.ini and conftests, opted in by flag.
        (directory / "pytest").mkdir()
        test = real_cvs.tree / "cvs" / "tests" / "health" / "rvs_cvs.py"
        runs.procs["pytest"] = _run(
            [python, "-m", "pytest", test, *files, "--cvs-orchestrator", "-p", "no:cacheprovider"],
            cwd=directory / "pytest",
        )
        runs.ids["pytest"] = _container_ids(sandbox, hosts, name)
        # 3. CVS's own `cvs run`, opted in by environment.
        (directory / "cvs-main").mkdir()
        runs.procs["cvs-main"] = _run(
            [python, "-m", "cvs.main", "run", "rvs_cvs", *files],
            cwd=directory / "cvs-main",
            CVS_ENGINE="cvs-orchestrator",
        )
        runs.ids["cvs-main"] = _container_ids(sandbox, hosts, name)
        yield runs
    finally:
        _run([python, "-m", "orchestrator", "down", "-c", cluster, "--force"], cwd=directory)


def _out(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout[-4000:] + proc.stderr[-4000:]


def test_install_rvs_cold_starts_then_fails_in_cvs_own_words(rvs_runs: RvsRuns) -> None:
    proc = rvs_runs.procs["install"]
    # RVS cannot be installed here (no GPUs, no internet): pytest's failure, exit 1.
    assert proc.returncode == 1, _out(proc)
    assert "filterwarnings" not in proc.stderr and "unrecognized arguments" not in proc.stderr
    setup = _setup_step(rvs_runs.results("install"))
    assert set(setup) == set(rvs_runs.hosts)
    assert all(h["status"] == "ok" for h in setup.values()), setup
    assert rvs_runs.results("install")["plan"][rvs_runs.hosts[0]]["action"] == "cold_start"
    assert set(rvs_runs.ids["install"]) == set(rvs_runs.hosts)


def test_rvs_cvs_in_a_second_invocation_attaches_to_the_same_containers(
    rvs_runs: RvsRuns,
) -> None:
    proc = rvs_runs.procs["rvs"]
    assert proc.returncode == 1, _out(proc)
    doc = rvs_runs.results("rvs")
    assert {row["action"] for row in doc["plan"].values()} == {"attach"}
    assert rvs_runs.ids["rvs"] == rvs_runs.ids["install"]
    # CVS's rvs_cvs judges its own outputs: steps are calls the suite made.
    assert any(s["name"].endswith("-exec") for s in doc["steps"])


def test_plain_pytest_with_the_flag_uses_this_engine_and_records_the_run(
    rvs_runs: RvsRuns,
) -> None:
    proc = rvs_runs.procs["pytest"]
    assert proc.returncode == 1, _out(proc)  # the suite's failures, not a usage error
    assert "cvs-orchestrator run records: runs/" in proc.stdout
    doc = rvs_runs.pytest_records("pytest")
    assert {row["action"] for row in doc["plan"].values()} == {"attach"}
    assert rvs_runs.ids["pytest"] == rvs_runs.ids["install"]


def test_cvs_own_cvs_run_with_cvs_engine_uses_this_engine(rvs_runs: RvsRuns) -> None:
    proc = rvs_runs.procs["cvs-main"]
    assert "cvs-orchestrator run records: runs/" in proc.stdout, _out(proc)
    doc = rvs_runs.pytest_records("cvs-main")
    assert {row["action"] for row in doc["plan"].values()} == {"attach"}
    assert rvs_runs.ids["cvs-main"] == rvs_runs.ids["install"]


def test_on_pytest_8_rvs_cvs_attaches_by_our_command_and_by_plain_pytest(
    rvs_runs: RvsRuns, real_cvs_pytest8: RealCvs, sandbox: Sandbox
) -> None:
    files = ["--cluster_file", str(rvs_runs.cluster), "--config_file", str(rvs_runs.config)]
    ours = _run(
        [real_cvs_pytest8.python, "-m", "orchestrator", "run", "rvs_cvs", *files,
         "--run-dir", rvs_runs.directory / "rvs-pytest8"], cwd=real_cvs_pytest8.tree)  # fmt: skip
    assert ours.returncode == 1, _out(ours)  # the suite's failures (no GPUs), nothing else
    assert "pytest-8.0." in ours.stdout
    doc = rvs_runs.results("rvs-pytest8")
    assert {row["action"] for row in doc["plan"].values()} == {"attach"}
    (rvs_runs.directory / "pytest8").mkdir()
    test = real_cvs_pytest8.tree / "cvs" / "tests" / "health" / "rvs_cvs.py"
    plain = _run(
        [real_cvs_pytest8.python, "-m", "pytest", test, *files, "--cvs-orchestrator",
         "-p", "no:cacheprovider"], cwd=rvs_runs.directory / "pytest8")  # fmt: skip
    assert plain.returncode == 1, _out(plain)
    assert rvs_runs.pytest_records("pytest8")["plan"].keys() == set(rvs_runs.hosts)
    assert _container_ids(sandbox, rvs_runs.hosts, rvs_runs.name) == rvs_runs.ids["install"]


def test_a_cold_start_is_a_few_lines_per_host_on_cvs_console(rvs_runs: RvsRuns) -> None:
    # CVS's pytest.ini turns live logging on at INFO: no SSH library chatter, no
    # shell programs, in the setup section of the console.
    out = rvs_runs.procs["install"].stdout
    setup = out.split("live log setup", 1)[1].split("live log call", 1)[0]
    assert "[conn=" not in out and "Command:" not in out
    ours = [x for x in setup.splitlines() if "cvs-orchestrator:" in x]
    assert len(ours) <= 3 * len(rvs_runs.hosts) + 2, setup


def test_the_run_log_file_is_cvs_test_log(rvs_runs: RvsRuns) -> None:
    log = rvs_runs.directory / "install" / "install_rvs.log"
    assert log.is_file() and "cvs-orchestrator:" in log.read_text()


# ---- vllm: its own conftest, launch and teardown, next to the persistent set ---------------


def test_vllm_launches_and_tears_down_next_to_a_running_persistent_set(
    rvs_runs: RvsRuns, real_cvs: RealCvs, sandbox: Sandbox
) -> None:
    """vllm never calls setup_sshd(): under CVS it starts no sshd, so the
    persistent set's sshd on the same hosts is no conflict (it was: exit 4)."""
    directory = rvs_runs.directory / "vllm"
    directory.mkdir()
    # The persistent set's sshd is up (install_rvs called setup_sshd()); vllm's
    # cluster file leaves its port at CVS's 2224 only if nothing else holds it.
    name = f"realcvs-vllm-{uuid.uuid4().hex[:6]}"
    cluster = json.loads(rvs_runs.cluster.read_text())
    cluster["container"]["sshd"] = {"port": 2231}  # the same port the set's sshd holds
    cluster["name"] = "realcvs-vllm"
    cluster_path = directory / "cluster.json"
    cluster_path.write_text(json.dumps(cluster))
    variant = json.loads((real_cvs.tree / VLLM_CONFIG).read_text())
    variant["container"].update(name=name, image=SSHD_TAG, lifetime="per_run")
    variant["container"]["runtime"]["args"].update(privileged=False, volumes=[])
    (directory / "thresholds.json").write_text("{}")
    variant["threshold_json"] = str(directory / "thresholds.json")
    config_path = directory / "vllm.json"
    config_path.write_text(json.dumps(variant).replace("<changeme>", str(directory)))
    proc = _run(
        [real_cvs.python, "-m", "orchestrator", "run", "vllm",
         "--cluster_file", cluster_path, "--config_file", config_path,
         "--run-dir", directory / "run"], cwd=real_cvs.tree)  # fmt: skip
    assert proc.returncode != 4, _out(proc)  # not refused
    assert "already in use" not in proc.stdout + proc.stderr
    cases = _junit_outcomes(directory / "run" / "junit.xml")
    assert cases["test_launch_container"] == "passed", _out(proc)
    assert cases["test_setup_sshd"] == "skipped"  # vllm's own: no sshd wanted
    assert cases["test_teardown"] == "passed", _out(proc)
    assert _container_ids(sandbox, rvs_runs.hosts, name) == {}  # per_run: removed
    assert _container_ids(sandbox, rvs_runs.hosts, rvs_runs.name) == rvs_runs.ids["install"]


# ---- an unreachable host: CVS's shape, our exit code 3 ------------------------------------


def test_an_unreachable_host_gives_cvs_marker_and_exit_3(
    real_cvs: RealCvs, sandbox: Sandbox, tmp_path: Path
) -> None:
    alive = sandbox.nodes[0].address
    # An address on the sandbox's own bridge that no host has.
    dead = alive.rsplit(".", 1)[0] + ".250"
    cluster = _cluster_json(
        sandbox, tmp_path, "unused", nodes=[alive, dead], backend="baremetal", lifetime=None
    )
    doc = json.loads(cluster.read_text())
    del doc["container"]
    doc["ssh"].update(connect_timeout=3, connect_retries=0)
    cluster.write_text(json.dumps(doc))
    config = _rvs_config(real_cvs, tmp_path)
    proc = _run(
        [real_cvs.python, "-m", "orchestrator", "run", "rvs_cvs",
         "--cluster_file", cluster, "--config_file", config,
         "--run-dir", tmp_path / "run"], cwd=real_cvs.tree)  # fmt: skip
    assert proc.returncode == 3, _out(proc)
    assert UNREACHABLE in proc.stdout, _out(proc)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["exit_code"] == 3
    assert any(s["hosts"].get(dead, {}).get("status") == "unreachable" for s in results["steps"])


# ---- CVS's surface: every public method, CVS's parameter names in CVS's order -------------

SIGNATURE_PROBE = """
import inspect, json
from cvs.core.orchestrators.container import ContainerOrchestrator
from cvs.lib.parallel.multiprocess_pssh import MultiProcessPssh
from cvs.lib.parallel.pssh import Pssh
from orchestrator.compat.cvs import CvsOrchestrator, HostHandle

# Not a suite's business: CVS's internals, or a reboot of every host.
SKIP = {"reboot_connections", "check_connectivity", "prune_nodes",
        "prune_unreachable_hosts", "inform_unreachability"}

def params(func):
    return [p for p in inspect.signature(func).parameters if p != "self"]

missing, differ = [], []
pairs = [(ContainerOrchestrator, CvsOrchestrator), (Pssh, HostHandle),
         (MultiProcessPssh, HostHandle)]
for theirs, ours in pairs:
    for name, func in inspect.getmembers(theirs, callable):
        if name.startswith("_") or name in SKIP:
            continue
        mine = getattr(ours, name, None)
        if mine is None:
            missing.append(f"{theirs.__name__}.{name}")
        elif params(mine)[: len(params(func))] != params(func):
            differ.append(f"{theirs.__name__}.{name}: {params(func)} vs {params(mine)}")
print(json.dumps({"missing": missing, "differ": differ}))
"""


def test_every_public_method_of_cvs_orchestrator_and_handles_is_here_with_cvs_parameters(
    real_cvs: RealCvs,
) -> None:
    proc = _run([real_cvs.python, "-c", SIGNATURE_PROBE], cwd=real_cvs.tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"missing": [], "differ": []}


# ---- inside a Slurm allocation: CVS's run ID and our records name the same job ------------

# Each way in, run by one `srun` step of a `salloc -N2` job on the sandbox's Slurm,
# so CVS counts itself inside a job (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID).
# CVS_WORKSPACE differs per way: CVS's record of each is <workspace>/cvs_runs/<run ID>.
SLURM_WAYS = """\
set -u
cd "$TREE"
way() {{ name=$1; shift; CVS_WORKSPACE=$DIR/ws/$name "$@" >"$DIR/$name.out" 2>&1; \
echo "$name=$?" >>"$DIR/rcs"; }}
way install "$PY" -m orchestrator run install_rvs {files} --run-dir "$DIR/install"
way rvs "$BIN/cvs" run rvs_cvs {files} --run-dir "$DIR/rvs"
mkdir -p "$DIR/pytest" "$DIR/cvs-main"
(cd "$DIR/pytest" && way pytest "$PY" -m pytest "$TREE/cvs/tests/health/rvs_cvs.py" {files} \
  --cvs-orchestrator -p no:cacheprovider)
(cd "$DIR/cvs-main" && CVS_ENGINE=cvs-orchestrator way cvs-main "$PY" -m cvs.main run rvs_cvs \
  {files})
echo "job=$SLURM_JOB_ID step=$SLURM_STEP_ID"
"""


def test_cvs_suites_in_an_srun_step_name_the_job_in_cvs_run_dir_and_our_records(
    real_cvs: RealCvs, slurm_sandbox: Sandbox, tmp_path: Path
) -> None:
    name = f"realcvs-slurm-{uuid.uuid4().hex[:6]}"
    # node_dict names the job's nodes as Slurm does; hosts_from: slurm (ours, CVS
    # ignores it) reaches them at Slurm's NodeAddr and records the job.
    cluster = _cluster_json(slurm_sandbox, tmp_path, name, nodes=["node1", "node2"])
    doc = json.loads(cluster.read_text())
    doc["hosts_from"] = "slurm"
    cluster.write_text(json.dumps(doc, indent=2))
    config = _rvs_config(real_cvs, tmp_path)
    rvs_doc = json.loads(config.read_text())
    rvs_doc["rvs"]["cvs_run_dir"] = "{run_dir}"  # makes the suites resolve CVS's RunLayout
    config.write_text(json.dumps(rvs_doc, indent=2))
    files = f"--cluster_file {cluster} --config_file {config}"
    env = {k: v for k, v in _env().items() if not k.startswith(("SLURM_", "CVS_"))}
    env.update(slurm_sandbox.slurm_env(), TREE=str(real_cvs.tree), PY=str(real_cvs.python),
               BIN=str(real_cvs.bin), DIR=str(tmp_path))  # fmt: skip
    step = ["srun", "-N1", "-n1", "sh", "-c", SLURM_WAYS.format(files=files)]
    try:
        proc = subprocess.run(["salloc", "-N2", *step], env=env, capture_output=True,
                              text=True, timeout=1500)  # fmt: skip
        found = {h: _inspect_named(slurm_sandbox, h, name) for h in ("node1", "node2")}
    finally:
        # The file's hosts come from Slurm: `down` runs in a job too; then by name (ours).
        down = [real_cvs.python, "-m", "orchestrator", "down", "-c", cluster, "--force"]
        subprocess.run(["salloc", "-N2", *map(str, down)], env=env, capture_output=True,
                       timeout=300, check=False)  # fmt: skip
        for h in ("node1", "node2"):
            subprocess.run([*slurm_sandbox.docker_argv(h), "rm", "-f", name],
                           capture_output=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = proc.stdout.rsplit("job=", 1)[1].split()[0]
    logs = {w: (tmp_path / f"{w}.out").read_text()[-3000:] for w in WAYS}
    # The suites ran and failed in CVS's own words (no GPUs here): exit 1, not a usage error.
    rcs = dict(line.split("=") for line in (tmp_path / "rcs").read_text().split())
    assert rcs == dict.fromkeys(WAYS, "1"), logs
    # CVS: inside the step its run ID is the job ID, through every way in.
    for way in WAYS:
        assert sorted(p.name for p in (tmp_path / "ws" / way / "cvs_runs").iterdir()) == [job], (
            logs[way]
        )
    print(f"job {job}: CVS's run dirs", {w: [job] for w in WAYS}, "exit codes", rcs)
    # Ours: the same job in every run's results.json...
    records = {
        "install": tmp_path / "install" / "results.json",
        "rvs": tmp_path / "rvs" / "results.json",
        **{w: next((tmp_path / w / "runs").glob("*-rvs_cvs/results.json")) for w in WAYS[2:]},
    }
    for way, path in records.items():
        assert json.loads(path.read_text())["cluster"].get("slurm_job") == job, logs[way]
    # ...and on the containers: started once by install_rvs, attached to by the rest.
    labels = [c["Config"]["Labels"] for h in ("node1", "node2") for c in found[h]]
    assert [lab.get("io.cvs.slurm-job") for lab in labels] == [job, job], found
    for way in WAYS[1:]:
        plan = json.loads(records[way].read_text())["plan"]
        assert {row["action"] for row in plan.values()} == {"attach"}, logs[way]
        assert set(plan) == {"node1", "node2"}


WAYS = ("install", "rvs", "pytest", "cvs-main")


def _inspect_named(sb: Sandbox, host: str, name: str) -> list[dict[str, Any]]:
    """`docker inspect` of the container of that exact name on that host ([] if none)."""
    argv = [*sb.docker_argv(host), "ps", "-aq", "--no-trunc", "--filter", f"name=^{name}$"]
    ids = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    if not ids.split():
        return []
    argv = [*sb.docker_argv(host), "inspect", *ids.split()]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(out.stdout))
