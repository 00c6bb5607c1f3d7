"""A remote command's output as it arrives: split into lines, kept as a bounded tail.

Output is never held whole. Each chunk goes (1) to the line splitter, whose
lines become `OutputLine` events (the live view, `--json`, a run's per-host
logs), and (2) to a per-stream tail of at most `limit` characters that ends
up in `HostResult.stdout` / `.stderr`, with the count of what was dropped.

Both are linear in the bytes received: a chunk is scanned once, and a line
that never ends is not re-joined per chunk but delivered in pieces of
`MAX_LINE` characters (`continues=True` on all but the last).
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Callable
from typing import AnyStr, Generic

# The default tail kept per stream: the last 1 MiB (characters; bytes for ASCII).
DEFAULT_TAIL = 1 << 20
# A line longer than this is delivered in pieces of this size.
MAX_LINE = 64 * 1024

LineHandler = Callable[[str, bool], None]  # (text, continues)


class _Tail(Generic[AnyStr]):
    """The last `limit` items (characters or bytes) of a stream, and how many
    came before them: whole chunks before the tail are dropped as they pass."""

    def __init__(self, empty: AnyStr, limit: int = DEFAULT_TAIL) -> None:
        if limit < 0:
            raise ValueError(f"tail limit must be >= 0, not {limit}")
        self.limit = limit
        self._empty: AnyStr = empty
        self._chunks: deque[AnyStr] = deque()
        self._size = 0
        self._popped = 0

    def add(self, chunk: AnyStr) -> None:
        if not chunk:
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        # Drop whole chunks that lie entirely before the tail.
        while self._chunks and self._size - len(self._chunks[0]) >= self.limit:
            first = self._chunks.popleft()
            self._size -= len(first)
            self._popped += len(first)

    @property
    def dropped(self) -> int:
        """Items received but no longer kept."""
        return self._popped + max(0, self._size - self.limit)

    @property
    def received(self) -> int:
        return self._popped + self._size

    def _kept(self) -> AnyStr:
        joined = self._empty.join(self._chunks)
        extra = len(joined) - self.limit
        return joined[extra:] if extra > 0 else joined


class StreamTail(_Tail[str]):
    """The last `limit` characters of a stream, and how many came before them."""

    def __init__(self, limit: int = DEFAULT_TAIL) -> None:
        super().__init__("", limit)

    def text(self) -> str:
        return self._kept()


class LineSplitter:
    """Feeds complete lines (without the newline) to `on_line`, in linear time."""

    def __init__(self, on_line: LineHandler, max_line: int = MAX_LINE) -> None:
        self.on_line = on_line
        self.max_line = max_line
        self._pending: list[str] = []
        self._pending_len = 0
        self._open = False  # the last line delivered was a piece (continues)

    def feed(self, data: str) -> None:
        *complete, rest = data.split("\n")
        if complete:
            first = complete[0]
            if self._pending:
                self._pending.append(first)
                first = "".join(self._pending)
                self._pending.clear()
                self._pending_len = 0
            self._open = False
            self.on_line(first, False)
            for line in complete[1:]:
                self.on_line(line, False)
        if rest:
            self._pending.append(rest)
            self._pending_len += len(rest)
            if self._pending_len >= self.max_line:
                text = "".join(self._pending)
                self._pending.clear()
                self._pending_len = 0
                for i in range(0, len(text) - self.max_line + 1, self.max_line):
                    self.on_line(text[i : i + self.max_line], True)
                self._open = True
                left = text[len(text) - len(text) % self.max_line :]
                if left:
                    self._pending.append(left)
                    self._pending_len = len(left)

    def flush(self) -> None:
        """Deliver an unterminated last line (ending a line delivered in pieces)."""
        if self._pending or self._open:
            text = "".join(self._pending)
            self._pending.clear()
            self._pending_len = 0
            self._open = False
            self.on_line(text, False)


def as_result_text(tail: StreamTail) -> str:
    """The tail as `HostResult` carries it: one trailing newline removed."""
    text = tail.text()
    return text[:-1] if text.endswith("\n") else text


class MarkingDecoder:
    """A stream's bytes as text, never silently changed: UTF-8 decoded across
    chunk boundaries, every byte that is not part of UTF-8 text shown as a
    `\\xNN` escape, and those bytes counted (`not_text`), so that whoever
    shows the text can say it is not what was printed. Linear in the bytes,
    in C: one decoder escapes, a second one (dropping what is not text)
    counts what is."""

    def __init__(self, *, show: bool = True) -> None:
        factory = codecs.getincrementaldecoder("utf-8")
        self._shown = factory(errors="backslashreplace") if show else None
        self._valid = factory(errors="ignore")
        self._bytes_in = 0
        self._valid_out = 0

    def decode(self, data: bytes, final: bool = False) -> str:
        """`data` as text (the empty string when made with show=False)."""
        self._bytes_in += len(data)
        valid = self._valid.decode(data, final)
        self._valid_out += len(valid) if valid.isascii() else len(valid.encode())
        return self._shown.decode(data, final) if self._shown is not None else ""

    @property
    def not_text(self) -> int:
        """Bytes so far that are not UTF-8 text (an unfinished sequence at the
        end is not counted until the stream ends: `flush`)."""
        pending = len(self._valid.getstate()[0])
        return self._bytes_in - self._valid_out - pending

    def flush(self) -> str:
        """The end of the stream: an unfinished sequence is not text."""
        return self.decode(b"", final=True)


class BytesTail(_Tail[bytes]):
    """The last `limit` bytes of a stream, and how many came before them (a
    stream passed on as bytes keeps its tail as bytes)."""

    def __init__(self, limit: int = DEFAULT_TAIL) -> None:
        super().__init__(b"", limit)

    def data(self) -> bytes:
        return self._kept()
