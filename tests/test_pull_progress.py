"""The pull's terminal output read as bytes done of the total
(containers/pull_progress.py): docker's and podman's bars, split anywhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from orchestrator.containers.pull_progress import PullProgress, PullState, clean_terminal
from orchestrator.events import CollectingSink, ImageProgress, Message
from orchestrator.results import HostResult
from orchestrator.ssh.seam import HostRunner, Request

# What `docker pull` writes to a terminal: every layer named, then bars
# redrawn in place (cursor up, clear line, \r).
DOCKER = (
    b"1.0: Pulling from cvs/sshd\r\n"
    b"aaaaaaaaaaaa: Already exists \r\n"
    b"4f4fb700ef54: Pulling fs layer \r\n"
    b"0123456789ab: Pulling fs layer \r\n"
    b"\x1b[1A\x1b[2K\r4f4fb700ef54: Downloading [=>     ]  1.5MB/3MB\r\x1b[1B"
    b"\x1b[2A\x1b[2K\r4f4fb700ef54: Downloading [====>  ]  2.5MB/3MB\r\x1b[2B"
    b"\x1b[1A\x1b[2K\r0123456789ab: Downloading [=>     ]  100kB/1MB\r\x1b[1B"
    b"\x1b[2A\x1b[2K\r4f4fb700ef54: Download complete \r\x1b[2B"
    b"\x1b[2A\x1b[2K\r4f4fb700ef54: Extracting [=>   ]  1.1MB/3MB\r\x1b[2B"
)
# `podman pull` (4.3.1) on a 200-column terminal, as recorded (two frames
# and the end), and a blob the host has.
PODMAN = (
    b"Getting image source signatures\r\n"
    b"Copying blob 0fc960695fc7 [>----------------] 3.4MiB / 135.7MiB\r\n"
    b"Copying blob 95ba14513ddb [=================] 22.0KiB / 22.0KiB\r\n"
    b"\x1b[2A\x1b[JCopying blob 0fc960695fc7 [==>--------------] 9.0MiB / 135.7MiB\r\n"
    b"Copying blob 95ba14513ddb done  \r\n"
    b"Copying blob 111111111111 skipped: already exists  \r\n"
    b"Copying config 580b0648c2 [=================] 1.2KiB / 1.2KiB\r\n"
)


def events_of(sink: CollectingSink) -> list[ImageProgress]:
    return [e for e in sink.events if isinstance(e, ImageProgress)]


def test_docker_bars_split_anywhere_give_bytes_done_and_the_total_once_every_layer_is_sized() -> (
    None
):
    sink = CollectingSink()
    progress = PullProgress(sink, every=0)
    take = progress.reader("node1")
    for i in range(0, len(DOCKER), 5):
        take("stdout", DOCKER[i : i + 5])

    seen = events_of(sink)
    assert [(e.done, e.total) for e in seen] == [
        (0, 0),
        (0, 0),
        (1_500_000, 0),  # the second layer's size not known yet
        (2_500_000, 0),
        (2_600_000, 4_000_000),
        (3_100_000, 4_000_000),  # the first layer complete
        (3_100_000, 4_000_000),
    ]
    assert all(e.source == "registry" and e.host == "node1" for e in seen)


def test_a_pull_that_succeeded_ends_with_done_equal_to_total() -> None:
    sink = CollectingSink()
    progress = PullProgress(sink)
    progress.reader("node1")("stdout", DOCKER)

    result = progress.finish("node1", HostResult("node1", "ok", exit_code=0, stdout="x\r\n"))

    last = events_of(sink)[-1]
    assert last.done == last.total == 4_000_000
    assert result.stdout == "x"


def test_a_failed_pull_ends_with_no_claim_and_its_words_as_plain_lines() -> None:
    sink = CollectingSink()
    progress = PullProgress(sink)
    progress.reader("node1")("stdout", DOCKER[:60])
    out = "\x1b[2K\rError response from daemon: manifest unknown\r\n"

    result = progress.finish("node1", HostResult("node1", "failed", exit_code=1, stdout=out))

    assert all(e.done < 4_000_000 for e in events_of(sink))
    assert result.stdout == "Error response from daemon: manifest unknown"


def test_podman_bars_count_binary_units_and_skip_blobs_the_host_has() -> None:
    state = PullState()
    for line in PODMAN.decode().split("\r\n"):
        state.segment(line)

    assert (state.done, state.total) == (
        int(9.0 * 2**20) + 22 * 2**10,
        int(135.7 * 2**20) + 22 * 2**10,
    )
    assert state.segment("Copying blob 0fc960695fc7 done  ")
    assert state.done == state.total


def test_events_come_at_most_once_a_second_per_host() -> None:
    sink = CollectingSink()
    progress = PullProgress(sink)  # every: 1 s
    take = progress.reader("node1")
    take("stdout", DOCKER)

    assert len(events_of(sink)) == 1


def test_the_kept_partial_segment_is_bounded() -> None:
    sink = CollectingSink()
    take = PullProgress(sink).reader("node1")
    for _ in range(100):
        take("stdout", b"x" * 100_000)

    assert events_of(sink) == []


def test_clean_terminal_keeps_each_redrawn_line_last_state() -> None:
    assert clean_terminal("a: 1MB\ra: 2MB\r\n\x1b[1Ab\r\n") == "a: 2MB\nb"


class _NoTerminal(HostRunner):
    """An sshd that refuses a terminal (what asyncssh's refusal reads as)
    and runs the command without one."""

    def __init__(self) -> None:
        self.requests: list[Request] = []

    async def send(self, host: str, request: Request) -> HostResult:
        self.requests.append(request)
        if request.pty:
            return HostResult(
                host, "unreachable", error="could not open a channel: PTY request failed"
            )
        return HostResult(host, "ok", exit_code=0, stdout="pulled\n")

    async def send_many(
        self, requests: Mapping[str, Request], *, limit: int | None = None
    ) -> dict[str, HostResult]:
        return {h: await self.send(h, r) for h, r in requests.items()}

    def held_process(self, target: Any, held: Any) -> Any:
        raise NotImplementedError


def test_an_sshd_that_refuses_a_terminal_gets_the_pull_as_before_and_says_why() -> None:
    sink, pool = CollectingSink(), _NoTerminal()

    result = anyio.run(lambda: PullProgress(sink).run(pool, "node1", ["docker", "pull", "x"]))

    assert result.ok and result.stdout == "pulled\n"
    assert [r.pty for r in pool.requests] == [True, False]
    said = [str(e.text) for e in sink.events if isinstance(e, Message) and e.host == "node1"]
    assert said == ["no pull progress: its sshd refused a terminal (PermitTTY, no-pty)"]
    assert events_of(sink) == []
