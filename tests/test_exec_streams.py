"""The pure parts of exec's streams (issue 42): bytes to text without a silent
change (`MarkingDecoder`), and one stdin to many readers (`StdinFeed`, over
a real pipe). The sandbox tests (test_exec_streams_sandbox.py) run them
through cvs."""

from __future__ import annotations

import os
import threading

import anyio
import pytest

from orchestrator.ssh.output import BytesTail, MarkingDecoder
from orchestrator.ssh.stdin import StdinFeed


def test_a_character_split_across_chunks_is_text_not_marked() -> None:
    decoder = MarkingDecoder()
    text = decoder.decode("é".encode()[:1]) + decoder.decode("é".encode()[1:] + b"!")
    assert (text + decoder.flush(), decoder.not_text) == ("é!", 0)


def test_bytes_that_are_not_text_are_escaped_and_counted() -> None:
    decoder = MarkingDecoder()
    text = decoder.decode(b"a\xffb\xfe") + decoder.flush()
    assert (text, decoder.not_text) == ("a\\xffb\\xfe", 2)


def test_an_unfinished_character_at_the_end_counts_once_the_stream_ends() -> None:
    decoder = MarkingDecoder()
    assert decoder.decode(b"ok\xe2\x82") == "ok" and decoder.not_text == 0
    assert decoder.flush() == "\\xe2\\x82" and decoder.not_text == 2


def test_a_bytes_tail_keeps_the_last_bytes_and_counts_the_rest() -> None:
    tail = BytesTail(4)
    for chunk in (b"abc", b"def", b"gh"):
        tail.add(chunk)
    assert (tail.data(), tail.dropped) == (b"efgh", 4)


@pytest.mark.parametrize("early", [False, True], ids=["both-read-all", "one-ends-early"])
def test_every_reader_gets_the_same_bytes_and_one_that_ends_is_dropped(early: bool) -> None:
    data = os.urandom(1_000_000)
    read, write = os.pipe()

    def writer() -> None:
        with os.fdopen(write, "wb") as out:
            out.write(data)

    got: dict[str, bytes] = {}

    async def main() -> None:
        feed = StdinFeed(read, chunk=4096)
        streams = {"a": feed.subscribe(), "b": feed.subscribe()}

        async def reader(name: str) -> None:
            parts: list[bytes] = []
            async with streams[name]:
                async for part in streams[name]:
                    parts.append(part)
                    if early and name == "b":
                        break  # a command that ended before its stdin did
            got[name] = b"".join(parts)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(feed.run)
                for name in streams:
                    tg.start_soon(reader, name)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        anyio.run(main)
    finally:
        thread.join(timeout=10)
        os.close(read)
    assert got["a"] == data
    if early:
        assert got["b"] and len(got["b"]) <= 4096 and data.startswith(got["b"])
    else:
        assert got["b"] == data
