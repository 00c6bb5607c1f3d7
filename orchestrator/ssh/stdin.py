"""`cvs exec`'s stdin to every host's command, and its output as bytes.

stdin (ClusterShell's convention, `clush`): the same bytes to every selected
host, streamed. `StdinFeed` reads our stdin once, a chunk at a time, and
hands each chunk to every host's command (one receive stream per host, a
buffer of one chunk): the slowest host paces the reading, so what is held is
a chunk or two whatever the input's size, and the chunk is one object shared
by every host. A host whose command ended (or never started) closes its
stream and is dropped; when none is left, the reading stops. At the end of
our stdin every host's stdin is closed.

`ExecIO` is what a command takes besides its text: that feed's stream for
its host, and `raw`: a callback that takes the command's output as bytes,
as they came (a single-host `cvs exec -N`), instead of lines.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from anyio.abc import ObjectReceiveStream
from anyio.streams.memory import MemoryObjectSendStream

# What one read of our stdin takes at most (asyncssh's channel window is 2 MiB;
# a chunk is one channel message or a few).
CHUNK = 64 * 1024

RawOutput = Callable[[str, bytes], None]  # (stream: "stdout" | "stderr", bytes)


@dataclass
class ExecIO:
    """What a command is given besides its text: its share of the stdin feed
    (None: its stdin is closed once the environment block is written) and
    `raw` (None: output as lines, `OutputLine` events)."""

    stdin: ObjectReceiveStream[bytes] | None = None
    raw: RawOutput | None = None


class StdinFeed:
    """One file descriptor's bytes to many readers, as described above."""

    def __init__(self, fd: int, *, chunk: int = CHUNK) -> None:
        self.fd = fd
        self.chunk = chunk
        self._senders: list[MemoryObjectSendStream[bytes]] = []
        self.bytes_read = 0

    def subscribe(self) -> ObjectReceiveStream[bytes]:
        """A reader's stream (before `run`): close it when done with it."""
        send, receive = anyio.create_memory_object_stream[bytes](1)
        self._senders.append(send)
        return receive

    async def _read(self) -> bytes:
        # A pipe (or socket, or device) is waited on by the event loop, then
        # read: a pipe that never ends must not keep cvs once every command
        # has ended, as a thread blocked in read(2) would at exit. A regular
        # file is always readable (epoll refuses it): a thread reads it.
        if stat.S_ISREG(os.fstat(self.fd).st_mode):
            return await anyio.to_thread.run_sync(os.read, self.fd, self.chunk)
        await anyio.wait_readable(self.fd)
        return os.read(self.fd, self.chunk)

    async def run(self) -> None:
        """Read until the end of the input (or no reader is left), handing
        each chunk to every reader; then close every reader's stream."""
        try:
            while self._senders:
                data = await self._read()
                if not data:
                    break
                self.bytes_read += len(data)
                for send in list(self._senders):
                    try:
                        await send.send(data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        self._senders.remove(send)  # its command ended: dropped
        finally:
            for send in self._senders:
                send.close()
            self._senders.clear()
