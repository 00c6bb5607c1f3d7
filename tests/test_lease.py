"""The lock's lease (issue 22), run locally under each /bin/sh a host may have:
a holder that hears nothing for LEASE seconds lets go and removes its
directory; one that is renewed keeps the lock. The real fault (a host's
packets dropped) is tests/test_faults.py."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.containers.locks import LEASE_SECONDS, RENEW_SECONDS, lock_command

SHELLS = {"dash": ("dash",), "bash": ("bash", "--posix"), "busybox": ("busybox", "sh")}


@pytest.fixture(params=sorted(SHELLS))
def sh(request: pytest.FixtureRequest) -> tuple[str, ...]:
    argv = SHELLS[request.param]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed here")
    return argv


def hold(sh: tuple[str, ...], lock: Path, lease: str) -> subprocess.Popen[str]:
    argv = remote.argv("lock", str(lock), "x", "no", "me pid 1: test", lease)
    # A session of its own, as sshd gives each channel: the watcher stops
    # the holder's process group, which must not be pytest's.
    holder = subprocess.Popen(
        [*sh, *argv[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "@@cvs:lock held x"
    assert holder.stdout.readline().strip() == "@@cvs:ready"
    return holder


def test_a_lock_nobody_renews_is_let_go_within_its_lease_and_leaves_nothing(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    lock = tmp_path / "cvs-c-h.lock"
    holder = hold(sh, lock, "1")
    try:
        # Stdin stays open (a silent network): only the lease ends it.
        start = time.monotonic()
        holder.wait(timeout=10)
        took = time.monotonic() - start
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    assert 0.9 <= took <= 4, took
    assert not lock.exists()


def test_a_renewed_lease_keeps_the_lock_until_stdin_closes(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    lock = tmp_path / "cvs-c-h.lock"
    # 2 s: busybox's `test -nt` compares whole seconds, so a lease must span
    # renewals in more than one second (the real one: 20 s, renewed every 5).
    holder = hold(sh, lock, "2")
    try:
        assert holder.stdin is not None
        for _ in range(20):  # 6 s: three leases long
            holder.stdin.write("renew\n")
            holder.stdin.flush()
            time.sleep(0.3)
        assert holder.poll() is None and lock.exists()
        holder.stdin.close()
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    assert not lock.exists()


def test_the_lock_command_carries_the_lease_the_renewer_keeps() -> None:
    assert RENEW_SECONDS * 3 <= LEASE_SECONDS
    text = lock_command("/tmp/cvs-c-h.lock", "shared", wait=None, description="d")
    assert f" d {LEASE_SECONDS}" in text


class _Stdin:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)


class _Holder:
    def __init__(self) -> None:
        self.stdin = _Stdin()
        self.exit_status: int | None = None


def test_the_renewer_writes_a_line_each_interval_and_says_when_the_holder_is_gone() -> None:
    import asyncio

    from orchestrator.containers.locks import LeaseRenewer

    lost: list[bool] = []

    async def scenario() -> None:
        holder = _Holder()
        renewer = LeaseRenewer(holder, 0.05, on_lost=lambda: lost.append(True))
        await asyncio.sleep(0.18)
        assert holder.stdin.lines[:3] == ["renew\n"] * 3
        holder.exit_status = 143  # the lease ran out on the host
        await asyncio.sleep(0.12)
        renewer.cancel()
        assert lost == [True]

    asyncio.run(scenario())
