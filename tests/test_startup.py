"""Start-up: commands that do not connect never import asyncssh, and importing
it spawns no process (asyncssh's optional-library lookup reads the linker's
cache instead of running ldconfig, gcc and ld). `cvs exec` with plain output
imports neither rich nor the modules of the commands it is not (copy, probe,
status, up's lifecycle, sandbox, suites).

The whole-process figure for `cvs exec` on one host is bench/cli_startup.py's.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.ssh import libsearch

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "cluster_samples" / "two_node.yaml"

# Runs `cvs ARGS` in a fresh interpreter, then prints which heavy modules it
# imported and every process it spawned.
PROBE = """
import json, subprocess, sys
spawned = []
real = subprocess.Popen._execute_child
def record(self, args, *rest, **kw):
    spawned.append(list(args) if isinstance(args, (list, tuple)) else [args])
    return real(self, args, *rest, **kw)
subprocess.Popen._execute_child = record
from orchestrator.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({
    "asyncssh": "asyncssh" in sys.modules,
    "spawned": spawned,
    "code": code,
    "modules": sorted(sys.modules),
}))
"""

# What `cvs exec` (plain output: a pipe) must not import: rich is for the live
# view on a terminal, the rest belongs to other commands. Each cost start-up
# time at every `cvs exec` (docs/performance.md, "CLI start-up").
NOT_FOR_EXEC = [
    "rich",
    "jinja2",
    "tarfile",
    "orchestrator.containers.copy",
    "orchestrator.containers.down",
    "orchestrator.containers.drift",
    "orchestrator.containers.barrier",
    "orchestrator.containers.lifecycle",
    "orchestrator.containers.locks",
    "orchestrator.containers.outcome",
    "orchestrator.containers.peer_check",
    "orchestrator.containers.pipeline",
    "orchestrator.containers.plan",
    "orchestrator.containers.prepare",
    "orchestrator.containers.probe",
    "orchestrator.containers.rollback",
    "orchestrator.containers.slurm_tie",
    "orchestrator.containers.status",
    "orchestrator.containers.steps",
    "orchestrator.containers.timeouts",
    "orchestrator.compat",
    "orchestrator.sandbox",
    "orchestrator.suites",
]
# What `cvs exec --host-os` on one host must not import besides: an in-container
# exec builds a runtime command (containers.argv with limits.*, for the
# host's runtime: remote.runtime) and names causes (containers.causes); a
# fleet past a size may use worker processes (the ssh.workers package,
# with pickle); difflib is for a misspelt key in the cluster file. Each was
# imported at every `cvs exec` (docs/performance.md, "Commands that connect").
NOT_FOR_HOST_EXEC = [
    *NOT_FOR_EXEC,
    "difflib",
    "pickle",
    "orchestrator.containers.causes",
    "orchestrator.containers.argv",
    "orchestrator.containers.inspection",
    "orchestrator.containers.labels",
    "orchestrator.containers.runtime_errors",
    "orchestrator.containers.mpi",
    "orchestrator.limits",
    "orchestrator.remote.runtime",
    "orchestrator.ssh.workers",
]


def not_for_exec(modules: object, unwanted: list[str] = NOT_FOR_EXEC) -> list[str]:
    """The modules of `unwanted` (packages with their submodules) among `modules`."""
    assert isinstance(modules, list)
    return [m for m in modules if any(m == u or m.startswith(f"{u}.") for u in unwanted)]


def probe(*args: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**os.environ, "PYTHONPATH": str(REPO), "CVS_CLUSTER": str(SAMPLE)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.stdout.strip(), proc.stderr[-2000:]
    doc: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["validate", "-c", str(SAMPLE)],
        ["plan", "--help"],
        ["up", "--help"],
        ["exec", "--help"],
        ["status", "--help"],
    ],
    ids=lambda a: " ".join(x for x in a if not x.startswith("/")),
)
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_commands_that_do_not_connect_never_import_asyncssh(args: list[str]) -> None:
    doc = probe(*args)
    assert doc["asyncssh"] is False, doc
    assert doc["spawned"] == [], doc


@pytest.mark.parametrize("args", [["--help"], ["exec", "--help"]], ids=" ".join)
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_help_never_imports_rich(args: list[str]) -> None:
    assert not_for_exec(probe(*args)["modules"]) == []


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_plain_cvs_exec_imports_neither_rich_nor_other_commands_modules(tmp_path: Path) -> None:
    # A host whose port refuses: the whole exec path runs (asyncssh, the event
    # loop, the per-host failure and its summary) with no sshd needed.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    cluster = tmp_path / "refused.yaml"
    cluster.write_text(
        "name: refused\nhosts:\n- name: n1\n  address: 127.0.0.1\n"
        f"ssh:\n  port: {port}\n  use_ssh_config: false\n"
    )
    doc = probe("exec", "-c", str(cluster), "--host-os", "true")
    assert doc["asyncssh"] is True and doc["code"] != 0, doc["code"]
    assert not_for_exec(doc["modules"], NOT_FOR_HOST_EXEC) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the loopback farm starts sshd (root)")
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_plain_cvs_exec_on_a_real_sshd_imports_neither_rich_nor_other_commands_modules() -> None:
    sys.path.insert(0, str(REPO))
    from bench.loopback import loopback_farm

    with loopback_farm(1) as farm:
        doc = probe("exec", "-c", str(farm.cluster_yaml()), "--host-os", "true")
    assert doc["code"] == 0
    assert not_for_exec(doc["modules"], NOT_FOR_HOST_EXEC) == []


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_importing_the_transport_spawns_no_process() -> None:
    script = (
        "import json, subprocess, sys\n"
        "spawned = []\n"
        "real = subprocess.Popen._execute_child\n"
        "def record(self, args, *rest, **kw):\n"
        "    spawned.append(str(args))\n"
        "    return real(self, args, *rest, **kw)\n"
        "subprocess.Popen._execute_child = record\n"
        "import orchestrator.ssh.transport\n"
        "print(json.dumps({'asyncssh': 'asyncssh' in sys.modules, 'spawned': spawned}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc == {"asyncssh": True, "spawned": []}, proc.stderr[-2000:]


def test_importing_the_transport_restores_the_standard_find_library() -> None:
    assert ctypes.util.find_library is not libsearch.find_library


@pytest.mark.skipif(libsearch._sonames() is None, reason="no readable glibc ld.so.cache")
@pytest.mark.parametrize("name", ["oqs", "liboqs", "nettle", "ssl", "z", "ffi"])
def test_the_linker_cache_answers_as_find_library_does(name: str) -> None:
    assert libsearch.find_library(name) == ctypes.util.find_library(name)


def test_an_unreadable_linker_cache_falls_back_to_the_standard_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bogus = tmp_path / "ld.so.cache"
    bogus.write_bytes(b"not a cache")
    monkeypatch.setattr(libsearch, "CACHE", bogus)
    libsearch._sonames.cache_clear()
    asked: list[str] = []
    monkeypatch.setattr(ctypes.util, "find_library", lambda n: asked.append(n) or "libx.so.1")
    try:
        assert libsearch.find_library("x") == "libx.so.1"
        assert asked == ["x"]
    finally:
        libsearch._sonames.cache_clear()
