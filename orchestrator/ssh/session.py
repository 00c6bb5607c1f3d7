"""One command on one SSH channel, as asyncssh's callbacks see it: its output
streamed and kept (a bounded tail), its stdin fed, how it ended. A host's
command (ssh/transport.py) and a container sshd's (ssh/container_channel.py)
both run on it; so do the keepalives kept while commands wait on a connection.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Protocol

import anyio

from orchestrator.events import OutputLine
from orchestrator.results import HostResult, Status
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.output import (
    BytesTail,
    LineSplitter,
    MarkingDecoder,
    StreamTail,
    as_result_text,
)
from orchestrator.ssh.stdin import RawOutput

if TYPE_CHECKING:
    from anyio.abc import ObjectReceiveStream

PREFERRED_CIPHERS = [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
    "chacha20-poly1305@openssh.com",
]


class KeptAlive(Protocol):
    """A connection and how many commands wait on it right now."""

    conn: asyncssh.SSHClientConnection
    active: int


@contextlib.asynccontextmanager
async def keepalive_while_waiting(link: KeptAlive, interval: float) -> AsyncIterator[None]:
    """Keepalives on `link` (every `interval` s, 0: none) while the block waits
    on it. An idle connection needs none (the next command notices a dead one
    within the bound), and they cost: 5000 connections kept open through a long
    fan-out sent 82 000 keepalives, a third of our CPU."""
    if interval and link.active == 0:
        with contextlib.suppress(asyncssh.Error, OSError):
            link.conn.set_keepalive(interval)
    link.active += 1
    try:
        yield
    finally:
        link.active -= 1
        if interval and link.active == 0:
            with contextlib.suppress(asyncssh.Error, OSError):
                link.conn.set_keepalive(0)


class CommandSession(asyncssh.SSHClientSession[bytes]):
    """One command's output, straight from asyncssh's callbacks: streamed as
    `OutputLine` events (or handed on as bytes: `raw`) and kept as a bounded
    tail per stream; and its stdin, fed from `cvs exec`'s (ssh/stdin.py).

    The channel carries bytes: output is decoded here, each byte that is not
    UTF-8 text shown as a `\\xNN` escape and counted (ssh/output.py), never
    replaced silently. Callbacks instead of reader tasks: a fan-out over
    hundreds of reused connections spends its time here, and tasks per
    channel doubled it.
    """

    def __init__(
        self,
        host: str,
        emit: Callable[[OutputLine], None] | None,
        tail: int,
        raw: RawOutput | None = None,
    ) -> None:
        self.host = host
        self.raw = raw
        self.tails = {"stdout": StreamTail(tail), "stderr": StreamTail(tail)}
        self.byte_tails = {"stdout": BytesTail(tail), "stderr": BytesTail(tail)}
        self.decoders = {"stdout": MarkingDecoder(), "stderr": MarkingDecoder()}
        self.splitters: dict[str, LineSplitter] = {}
        if emit is not None and raw is None:
            for stream in ("stdout", "stderr"):
                self.splitters[stream] = LineSplitter(self._emitter(emit, stream))
        self.exit_code: int | None = None
        self.lost: Exception | None = None
        self.closed = anyio.Event()
        self.discarding = False
        self._writable = anyio.Event()
        self._writable.set()

    def _emitter(
        self, emit: Callable[[OutputLine], None], stream: str
    ) -> Callable[[str, bool], None]:
        host = self.host

        def line(text: str, continues: bool) -> None:
            emit(OutputLine(host=host, stream=stream, line=text, continues=continues))  # type: ignore[arg-type]

        return line

    def discard(self) -> None:
        """Drop what the command prints from now on: cvs gave up on it (a
        cancellation), so nobody reads it, and a chatty command's output,
        decoded and sent on as lines while its kill runs, kept the event loop
        busy enough to delay the kill's own timers by seconds (four hosts
        printing `seq 1 300000`: 11 s from the cancel to the kill's end)."""
        self.discarding = True

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self.discarding:
            return
        stream = "stderr" if datatype == asyncssh.EXTENDED_DATA_STDERR else "stdout"
        if self.raw is not None:
            # As they came: kept as bytes, decoded (the tail only) at the end.
            self.byte_tails[stream].add(data)
            self.raw(stream, data)
            return
        self._text(stream, self.decoders[stream].decode(data))

    def _text(self, stream: str, text: str) -> None:
        self.tails[stream].add(text)
        splitter = self.splitters.get(stream)
        if splitter is not None:
            splitter.feed(text)

    def pause_writing(self) -> None:
        self._writable = anyio.Event()

    def resume_writing(self) -> None:
        self._writable.set()

    async def feed(
        self, chan: asyncssh.SSHClientChannel[bytes], source: ObjectReceiveStream[bytes]
    ) -> None:
        """Write what `source` brings (this host's share of the stdin feed)
        to the command's stdin, no faster than the channel drains, then close
        it. Closing `source` however this ends drops the host from the feed;
        a command that ended before reading it all is no error."""
        async with source:
            with contextlib.suppress(asyncssh.Error, OSError):
                async for data in source:
                    chan.write(data)
                    await self._writable.wait()
                chan.write_eof()

    def result(
        self, status: Status, exit_code: int | None, error: str | None, start: float
    ) -> HostResult:
        """The command's result: how it ended (the caller's reading), its kept
        tails and what they dropped (bytes when handed on raw, else
        characters), what was not text, and the time since `start`."""
        kept: dict[str, tuple[str, int, int]] = {}
        for stream in ("stdout", "stderr"):
            if self.raw is not None:
                decoder, tail = MarkingDecoder(), self.byte_tails[stream]
                text = decoder.decode(tail.data(), final=True)
                kept[stream] = (_one_newline_off(text), tail.dropped, decoder.not_text)
            else:
                chars, bad = self.tails[stream], self.decoders[stream].not_text
                kept[stream] = (as_result_text(chars), chars.dropped, bad)
        (out, out_dropped, out_bad), (err, err_dropped, err_bad) = kept["stdout"], kept["stderr"]
        return HostResult(
            self.host,
            status,
            exit_code=exit_code,
            stdout=out,
            stderr=err,
            duration=time.monotonic() - start,
            error=error,
            stdout_dropped=out_dropped,
            stderr_dropped=err_dropped,
            stdout_not_text=out_bad,
            stderr_not_text=err_bad,
        )

    def exit_status_received(self, status: int) -> None:
        self.exit_code = status

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self.exit_code = 128 + _signal_number(signal)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.discarding:
            for stream, decoder in self.decoders.items():
                if self.raw is None:
                    self._text(stream, decoder.flush())
            for splitter in self.splitters.values():
                splitter.flush()
        self.lost = exc
        self.closed.set()


async def fed_until_closed(
    chan: asyncssh.SSHClientChannel[bytes],
    session: CommandSession,
    stdin: ObjectReceiveStream[bytes] | None,
) -> None:
    """Until the command ends: its stdin closed at once, or fed from `stdin`
    (then closed) while it runs; what it did not read when it ended is moot."""
    if stdin is None:
        # A command may end before it reads its stdin (a working directory it
        # could not enter): the channel may be closing already.
        with contextlib.suppress(asyncssh.Error, OSError):
            chan.write_eof()
        await session.closed.wait()
        return
    async with anyio.create_task_group() as tg:
        tg.start_soon(session.feed, chan, stdin)
        await session.closed.wait()
        tg.cancel_scope.cancel()


def _one_newline_off(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _signal_number(name: str) -> int:
    try:
        return int(signal.Signals[f"SIG{name}"])
    except KeyError:
        return 0
