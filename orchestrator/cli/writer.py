"""cvs's stdout and stderr through a thread: a reader that stops reading blocks
that thread, never the work (cli.main installs it on a pipe or file)."""

from __future__ import annotations

import collections
import threading
from typing import IO, Any


class BackgroundWriter:
    """A text stream written by a thread, so a full pipe blocks that thread and
    never the event loop: a reader that stops reading our output must not keep
    the hosts' locks held (the work goes on and releases them; the output waits).

    Memory stays bounded: past `limit` characters queued, what comes next is
    spilled to an unlinked temporary file and written from there, in order.
    `drain()` (at exit, after the work) writes what is left.
    """

    def __init__(self, stream: Any, limit: int = 16 << 20) -> None:
        self._stream = stream
        self._limit = limit
        self._queue: collections.deque[str] = collections.deque()
        self._size = 0
        self._spill: IO[str] | None = None  # temporary file once the queue is full
        self._spill_read = 0
        self._spill_write = 0
        self._closed = False
        self._error: OSError | None = None  # the write that failed (reader gone)
        # The command said itself what a closed stdout stopped (tell_stdout_closed).
        self.told = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="cvs-output", daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        if self._error is not None:
            # The reader went away: say so to the caller (the sinks stop the
            # run on a BrokenPipeError), in the caller's thread.
            raise type(self._error)(*self._error.args)
        with self._cv:
            if self._spill is not None or self._size + len(text) > self._limit:
                self._to_spill(text)
            else:
                self._queue.append(text)
                self._size += len(text)
            self._cv.notify_all()
        return len(text)

    def _to_spill(self, text: str) -> None:
        # tempfile (about 7 ms of every piped `cvs` start) only once output spills.
        import tempfile

        if self._spill is None:
            self._spill = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by the writer thread once drained)
            self._spill_read = self._spill_write = self._spill.tell()
        self._spill.seek(self._spill_write)
        self._spill.write(text)
        self._spill_write = self._spill.tell()

    def _next_chunk(self) -> str | None:
        """What to write next, in order (queue first, then the spill); None: done."""
        with self._cv:
            while not self._queue and self._spill is None and not self._closed:
                self._cv.wait()
            if self._queue:
                chunk = "".join(self._queue)
                self._queue.clear()
                self._size = 0
                return chunk
            if self._spill is not None:
                self._spill.flush()
                self._spill.seek(self._spill_read)
                chunk = self._spill.read(1 << 20)
                self._spill_read = self._spill.tell()
                if self._spill_read == self._spill_write:
                    self._spill.close()
                    self._spill = None
                return chunk
            return None

    def flush(self) -> None:
        """Nothing to wait for: the thread flushes after every chunk it writes."""

    def _run(self) -> None:
        broken = False
        while (chunk := self._next_chunk()) is not None:
            if broken:
                continue
            try:
                self._stream.write(chunk)
                self._stream.flush()
            except OSError as exc:
                broken, self._error = True, exc  # the reader went away: drop the rest
            except ValueError:
                broken = True

    @property
    def broken(self) -> bool:
        """Its reader went away (a write failed): what comes next is dropped."""
        return self._error is not None

    def drain(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
