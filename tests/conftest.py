"""Shared fixtures: the real sandbox cluster (netns + sshd + dockerd per host).

`sandbox` (4 hosts) and `egress_sandbox` (node1 + egress1, whose containers
reach Debian's mirrors) are session-scoped and built lazily: only when a test
asks for them. Tests using them get the `sandbox` mark automatically, so
`pytest -m "not sandbox"` runs without root.

Teardown always runs: pytest finalizes session fixtures on failure and on
Ctrl-C, and an atexit hook catches what escapes that (SIGTERM from a CI
timeout is turned into KeyboardInterrupt for the same reason).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import itertools
import os
import pwd
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from private_dockerd import PrivateDockerd, private_dockerd_skip_reason
from slurmtools import JobEnd, slurm, up_in_batch

from orchestrator.sandbox import Sandbox, sandbox_down, sandbox_up

# Fixtures that build a sandbox: a test using one is a sandbox test (`-m "not
# sandbox"` builds none). `breakable`: test_heal's own sandbox, broken on purpose.
SANDBOX_FIXTURES = {
    "sandbox",
    "egress_sandbox",
    "make_sandbox",
    "breakable",
    "faulty",
    "slurm_sandbox",
    "registry_sandbox",
}
# Property tests try their full counts under Hypothesis's `ci` profile (.ci/test
# sets HYPOTHESIS_PROFILE=ci), a fifth of them elsewhere (tests/properties.py).
# Loaded here, before pytest's `--hypothesis-profile` is read and before any test
# module is imported. The plugin tests' venvs (.ci/venvs) have no hypothesis.
if importlib.util.find_spec("hypothesis") is not None:
    import properties

    properties.load_profile(os.environ.get("HYPOTHESIS_PROFILE", properties.DEV))
REQUIRED_TOOLS = ("ip", "nsenter", "dockerd", "sshd", "debootstrap", "ssh", "sudo")

# The pytests these tests start (`cvs run`'s child, plain pytest in a temporary
# directory) run small suites that never use hypothesis, anyio's plugin or
# pytest-benchmark, test dependencies whose plugins cost each of them about a
# second of CPU at start (most of what such a test spends). They inherit this;
# our own session has read it.
os.environ["PYTEST_ADDOPTS"] = " ".join(
    filter(
        None,
        [os.environ.get("PYTEST_ADDOPTS"), "-p no:hypothesispytest -p no:anyio -p no:benchmark"],
    )
)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "sandbox tests need root"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t, path=path) is None]
    if missing:
        return "sandbox tests need " + ", ".join(missing)
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(autouse=True)
def _no_sandbox_without_the_mark(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-m "not sandbox"` builds no sandbox: a test without the mark that starts
    building one (sandbox_up, past its argument checks) fails at once, saying
    so, before anything is created."""
    if request.node.get_closest_marker("sandbox") is not None:
        return
    from orchestrator.sandbox import core

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            f"{request.node.nodeid} builds a sandbox without the sandbox mark: take it "
            f"from a sandbox fixture ({', '.join(sorted(SANDBOX_FIXTURES))}) or mark the test"
        )

    monkeypatch.setattr(core, "_new_sandbox", refuse)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_sessionstart(session: pytest.Session) -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started with `&` from a script, SIGINT comes in ignored, and every
        # `cvs` the tests start would inherit that: the Ctrl-C tests would see
        # it ignored. A handler of ours is reset to the default in children.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # `cvs exec` passes its stdin on to the commands (issue 42), and every
    # `cvs` the tests start inherits ours: a runner's pipe that never ends
    # would be every command's stdin. /dev/null, unless a test gives one.
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Once no sandbox is left, the records cvs kept in the sandbox login users'
    homes (provisioning and adoption, by container ID) are leftovers of this
    run: remove them, so runs do not pile them up there."""
    if os.geteuid() != 0:
        return
    from orchestrator.sandbox import DOCKER_USER, NO_DOCKER_USER, SUDO_USER, network

    root = network.RUN_ROOT
    if root.is_dir() and any(p.name.isdigit() for p in root.iterdir()):
        return  # a sandbox still runs (another run, or a user's own): its records stay
    for user in (DOCKER_USER, SUDO_USER, NO_DOCKER_USER):
        try:
            home = Path(pwd.getpwnam(user).pw_dir)
        except KeyError:
            continue
        for records in ("provisioned", "adopted"):
            shutil.rmtree(home / ".local" / "state" / "cvs" / records, ignore_errors=True)


def _down_quietly(directory: Path) -> None:
    with contextlib.suppress(Exception):
        sandbox_down(directory)


@contextlib.contextmanager
def _built(directory: Path, **kwargs: object) -> Iterator[Sandbox]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # A partial per directory: atexit.unregister removes by equality, and
    # partials are equal only to themselves.
    hook = functools.partial(_down_quietly, directory)
    atexit.register(hook)
    try:
        yield sandbox_up(directory, **kwargs)  # type: ignore[arg-type]
    finally:
        sandbox_down(directory)
        atexit.unregister(hook)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A 4-host sandbox (node1..node4) for the whole session. Do not break it:
    tests that stop daemons or rotate keys use `make_sandbox` instead."""
    with _built(tmp_path_factory.mktemp("sandbox") / "sb", hosts=4) as sb:
        yield sb


@pytest.fixture(scope="session")
def egress_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """node1 plus egress1 (root namespace, containers with --network host reach
    Debian's mirrors); its cluster file is `egress_cluster_file`."""
    with _built(tmp_path_factory.mktemp("egress") / "sb", hosts=1, egress_host=True) as sb:
        yield sb


@pytest.fixture(scope="session")
def slurm_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """node1, node2 with a real Slurm (munge, slurmctld, a slurmd in each
    host's namespace) and four stand-in GPUs each, declared as gres gpu:4."""
    with _built(tmp_path_factory.mktemp("slurm") / "sb", hosts=2, slurm=True, gpus=4) as sb:
        yield sb


@pytest.fixture(scope="session")
def registry_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """node1, node2 and `--registry --registry-rate 200mbit`: the cluster's
    image only in the registry (its own namespace, its link shaped), which
    the cluster file names; DIR/registry.env says where."""
    directory = tmp_path_factory.mktemp("registry") / "sb"
    with _built(directory, hosts=2, registry=True, registry_rate="200mbit") as sb:
        yield sb


@pytest.fixture(scope="session")
def time_limited_jobs(
    slurm_sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, JobEnd]]:
    """Two batch jobs of a minute (`--time=1`, Slurm's shortest), per_run and
    per_job containers, started together and each followed to its end in a
    thread: the two time-limit tests (test_slurm_sandbox, test_slurm_jobs_sandbox)
    share one wait for the limit instead of a minute and a half each."""
    ends: dict[str, JobEnd] = {}
    try:
        for lifetime in ("per_run", "per_job"):
            path = tmp_path_factory.mktemp(f"time-limit-{lifetime}")
            # per_run: the sandbox's own file as it is (its lifetime).
            kept = lifetime if lifetime == "per_job" else ""
            job = up_in_batch(slurm_sandbox, path, "sleep 600", "--time=1", lifetime=kept)
            ends[lifetime] = JobEnd(slurm_sandbox, job)
        yield ends
    finally:
        for end in ends.values():
            end.stop()
            slurm(slurm_sandbox, "scancel", end.job)


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[Callable[..., Sandbox]]:
    """Factory for throwaway sandboxes a test may break; all torn down after it."""
    counter = itertools.count()
    with contextlib.ExitStack() as stack:

        def make(hosts: int = 1, **kwargs: object) -> Sandbox:
            directory = tmp_path / f"sb{next(counter)}"
            return stack.enter_context(_built(directory, hosts=hosts, **kwargs))

        yield make


# --- a private dockerd (root namespace) for docker runtime and probe tests ---


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateDockerd]:
    reason = private_dockerd_skip_reason()
    if reason:
        pytest.skip(reason)
    # A short path: the daemon's unix sockets live under it (108-byte limit).
    root = Path(tmp_path_factory.mktemp("dockerd"))
    daemon = PrivateDockerd(root)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def image_id(dockerd: PrivateDockerd) -> str:
    return dockerd.import_busybox()
