"""`cvs run` against the real sandbox (netns hosts with sshd + dockerd), in new processes.

Every test writes its own cluster file variant with a distinct container name
(and the in-container sshd off: suites here do not need it, and two containers
on one host would both want its port), and removes its containers with
`cvs down --force` afterwards.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import browser_skip_reason, open_page
from clitools import CVS, REPO, cvs_in_process
from suitetools import (
    NODES,
    cluster_variant,
    containers,
    cvs,
    results,
    suite_env,
    write_suite,
)

from orchestrator.sandbox import DOCKER_USER, Sandbox

# Every process's command line in a container (minbase images have no ps).
LIST_COMMANDS = 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline; echo; done'


@pytest.fixture
def removed_after(tmp_path: Path) -> Iterator[list[Path]]:
    """Cluster files whose containers `cvs down --force` removes after the test."""
    files: list[Path] = []
    yield files
    for f in files:
        cvs("down", "-c", str(f), "--force", cwd=tmp_path)


# ---- persistent: install_demo, then test_demo in a new process -------------------------


class DemoRuns:
    def __init__(self, directory: Path, cluster: Path) -> None:
        self.directory = directory
        self.cluster = cluster
        self.procs: dict[str, subprocess.CompletedProcess[str]] = {}

    def run(self, key: str, *args: str) -> subprocess.CompletedProcess[str]:
        run_dir = self.directory / key
        proc = cvs(
            "run", "-c", str(self.cluster), *args, "--run-dir", str(run_dir), cwd=self.directory
        )
        self.procs[key] = proc
        return proc

    def dir(self, key: str) -> Path:
        return self.directory / key


@pytest.fixture(scope="module")
def demo(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRuns]:
    """test_demo before any install, install_demo, then test_demo: three processes."""
    directory = tmp_path_factory.mktemp("demo")
    runs = DemoRuns(directory, cluster_variant(sandbox, directory, "cvs-suite-demo", "persistent"))
    try:
        runs.run("before", "test_demo")
        runs.run("install", "install_demo")
        runs.run("after", "test_demo")
        yield runs
    finally:
        cvs("down", "-c", str(runs.cluster), "--force", cwd=directory)


def test_test_demo_before_install_fails_with_a_per_host_report(demo: DemoRuns) -> None:
    proc = demo.procs["before"]
    assert proc.returncode == 1, proc.stderr
    for host in NODES:
        assert f"installed on {host}: failed: exit 1, expected 0" in proc.stdout
    assert "run 'cvs run install_demo' first" in proc.stdout
    doc = results(demo.dir("before"))
    assert [s["status"] for s in doc["steps"]] == ["failed", "skipped"]
    # The skipped step says why, naming the step and the hosts (issue 25), live and at the end.
    skipped = doc["steps"][1]
    why = f"step {doc['steps'][0]['name']!r} failed on node[1-4]"
    assert f"skipping {skipped['name']}: {why}" in proc.stderr, proc.stderr
    assert f"skipped: {skipped['name']} ({why})" in proc.stdout
    assert doc["plan"]["node1"]["action"] == "cold_start"


def test_install_then_test_in_a_new_process_passes(demo: DemoRuns, sandbox: Sandbox) -> None:
    assert demo.procs["install"].returncode == 0, demo.procs["install"].stdout
    proc = demo.procs["after"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = results(demo.dir("after"))
    assert {h: e["action"] for h, e in doc["plan"].items()} == dict.fromkeys(NODES, "attach")
    assert all(s["status"] == "ok" for s in doc["steps"])
    assert containers(sandbox, "cvs-suite-demo") == dict.fromkeys(NODES, "running")


def test_junit_has_one_testcase_per_step_and_host(demo: DemoRuns) -> None:
    root = ET.parse(demo.dir("before") / "junit.xml").getroot()
    cases = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert cases == [(f"test_demo.{s}", h) for s in ("installed", "output") for h in NODES]
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("skipped")) == ("4", "4")


def test_run_dir_has_events_logs_and_printed_paths(demo: DemoRuns) -> None:
    run_dir = demo.dir("after")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    steps = {(e["host"], e["step"], e["status"]) for e in events if e["event"] == "HostStep"}
    for host in NODES:
        assert {(host, "output", "started"), (host, "output", "ok")} <= steps
        log = (run_dir / "logs" / "output" / f"{host}.log").read_text()
        assert log.startswith("cvs-demo ok ")
    for name in ("events.jsonl", "results.json", "junit.xml"):
        assert str(run_dir / name) in demo.procs["after"].stdout


@pytest.mark.skipif(browser_skip_reason() is not None, reason=str(browser_skip_reason()))
def test_report_html_of_a_failed_run_shows_the_failing_cells_in_chromium(demo: DemoRuns) -> None:
    report = demo.dir("before") / "report.html"
    assert str(report) in demo.procs["before"].stdout
    with open_page(report) as visit:
        cells = visit.page.locator('td[data-step="installed"][data-status="failed"]')
        assert cells.count() == len(NODES)
        assert "failed" in cells.first.inner_text()
        details = visit.page.locator("details#out-installed-node1")
        assert details.get_attribute("open") is not None
        assert "run 'cvs run install_demo' first" in details.inner_text()
        href = details.locator("a", has_text="full log").get_attribute("href")
        assert href is not None and (report.parent / href).is_file()
        image = visit.page.locator("dl.facts").inner_text()
        assert "sha256:" in image
    assert visit.console_errors == [] and visit.page_errors == []
    assert visit.requests == [report.resolve().as_uri()]


def test_step_timeout_is_recorded_and_stops_the_remote_command(
    demo: DemoRuns, sandbox: Sandbox
) -> None:
    write_suite(demo.directory, "hang", [{"name": "hang", "run": "sleep 987", "timeout": 2}])
    started = time.monotonic()
    proc = demo.run("hang", str(demo.directory / "hang.yaml"))
    assert proc.returncode == 1 and time.monotonic() - started < 60
    hosts = results(demo.dir("hang"))["steps"][0]["hosts"]
    assert {h: r["status"] for h, r in hosts.items()} == dict.fromkeys(NODES, "timeout")
    time.sleep(1)
    for host in NODES:
        ps = subprocess.run(
            [*sandbox.docker_argv(host), "exec", "cvs-suite-demo", "sh", "-c", LIST_COMMANDS],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "sleep 987" not in ps.stdout, host


def test_host_step_runs_outside_the_container(demo: DemoRuns) -> None:
    steps = [
        # Containers run as root; the sandbox hosts log in as the unprivileged docker user.
        {"name": "inside", "run": "id -un", "expect": {"stdout": "^root$"}},
        {
            "name": "outside",
            "run": "id -un",
            "on": "host",
            "hosts": "node[2-3]",
            "expect": {"stdout": f"^{DOCKER_USER}$"},
        },
    ]
    write_suite(demo.directory, "where", steps)
    proc = demo.run("where", str(demo.directory / "where.yaml"))
    assert proc.returncode == 0, proc.stdout
    assert list(results(demo.dir("where"))["steps"][1]["hosts"]) == ["node2", "node3"]


# ---- per_run: nothing left behind ------------------------------------------------------


def test_per_run_removes_containers_when_a_step_fails(
    sandbox: Sandbox, tmp_path: Path, removed_after: list[Path]
) -> None:
    cluster = cluster_variant(sandbox, tmp_path, "cvs-suite-fail", "per_run")
    removed_after.append(cluster)
    steps = [
        {"name": "boom", "run": "echo oops; exit 7", "hosts": "node2"},
        {"name": "never", "run": "true"},
    ]
    suite = write_suite(tmp_path, "fails", steps)
    proc = cvs(
        "run", "-c", str(cluster), str(suite), "--run-dir", str(tmp_path / "r"), cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "boom on node2: failed: exit 7, expected 0" in proc.stdout
    doc = results(tmp_path / "r")
    assert doc["steps"][1]["status"] == "skipped"
    assert containers(sandbox, "cvs-suite-fail") == {}


def test_per_run_interrupted_exits_130_and_leaves_no_container(
    sandbox: Sandbox, tmp_path: Path, removed_after: list[Path]
) -> None:
    cluster = cluster_variant(sandbox, tmp_path, "cvs-suite-int", "per_run")
    removed_after.append(cluster)
    suite = write_suite(tmp_path, "long", [{"name": "nap", "run": "sleep 120"}])
    run_dir = tmp_path / "r"
    argv = [*CVS, "run", "-c", str(cluster), str(suite)]
    proc = subprocess.Popen(
        [*argv, "--run-dir", str(run_dir)],
        cwd=tmp_path,
        env=suite_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A parent started in the background may ignore SIGINT; the child must not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        events = run_dir / "events.jsonl"
        deadline = time.monotonic() + 180
        while '"step": "nap", "status": "started"' not in (
            events.read_text() if events.exists() else ""
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "step never started"
            time.sleep(0.2)
        time.sleep(1)
        assert containers(sandbox, "cvs-suite-int") == dict.fromkeys(NODES, "running")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    doc = results(run_dir)
    assert doc["interrupted"] and doc["exit_code"] == 130
    assert doc["steps"][0]["hosts"]["node1"]["status"] == "interrupted"
    assert containers(sandbox, "cvs-suite-int") == {}
    # ... and says so: Ctrl-C's output names what the clean-up removed (issue 25).
    assert "removed this run's per_run containers on node[1-4] (interrupted)" in err, err


# ---- the pytest plugin example ------------------------------------------------------------


def test_pytest_plugin_example_runs_against_the_sandbox(
    sandbox: Sandbox, tmp_path: Path, removed_after: list[Path]
) -> None:
    cluster = cluster_variant(sandbox, tmp_path, "cvs-suite-pytest", "per_run")
    removed_after.append(cluster)
    example = REPO / "orchestrator" / "examples" / "test_with_cluster.py"
    argv = [sys.executable, "-m", "pytest", "-q", str(example)]
    proc = subprocess.run(
        [*argv, "--cvs-orchestrator-cluster", str(cluster), "-p", "no:cacheprovider"],
        cwd=REPO,
        env=suite_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout
    assert containers(sandbox, "cvs-suite-pytest") == {}


# ---- bad input: exit 2, one line, before touching any host ---------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: s\nsteps:\n  - name: a\n    run: [x\n",
            "bad.yaml:4:10: the '[' opened on this line is never closed",
        ),
        ("name: s\nsteps:\n  - {name: a, run: x, retries: 2}\n", "steps[0].retries: unknown key"),
        (
            "name: s\nsteps:\n  - {name: chk, run: x, expect: {stdout: '(x'}}\n",
            "steps[0].expect.stdout: invalid regex '(x'",
        ),
    ],
    ids=["bad-yaml", "unknown-key", "bad-regex"],
)
def test_malformed_suite_exits_2_with_one_line(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    proc = cvs_in_process("run", "-c", "/nonexistent/cluster.yaml", "./bad.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr


def test_unknown_suite_name_exits_2_naming_where_it_looked(tmp_path: Path) -> None:
    proc = cvs_in_process("run", "-c", "/nonexistent/cluster.yaml", "no_such_suite", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert "unknown suite 'no_such_suite': looked in " in line
    assert str(tmp_path / "suites") in line and "shipped examples" in line


def test_run_list_shows_names_descriptions_and_sources(tmp_path: Path) -> None:
    (tmp_path / "suites").mkdir()
    write_suite(tmp_path / "suites", "mine", [{"name": "a", "run": "true"}])
    proc = cvs_in_process("run", "--list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    assert {"mine", "install_demo", "test_demo"} <= set(rows)
    assert "./suites: " in rows["mine"] and "shipped: " in rows["test_demo"]
    assert "Run /opt/demo/bin/cvs-demo" in rows["test_demo"]
