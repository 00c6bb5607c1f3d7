"""Command output as it streams: bounded tails, line splitting in linear time,
env values over stdin (pure parts; the sandbox tests are in test_streams_sandbox.py)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.events import OutputLine
from orchestrator.results import HostResult
from orchestrator.ssh.envpass import env_block, env_reader
from orchestrator.ssh.output import LineSplitter, StreamTail, as_result_text
from orchestrator.ssh.session import CommandSession
from orchestrator.suites.records import RunOutcome, RunRecorder
from orchestrator.suites.report import write_report


def a_run_outcome() -> RunOutcome:
    return RunOutcome(
        suite="s", suite_file="", description="", cluster="c", cluster_file="",
        lifetime=None, started=datetime.now(UTC),
    )  # fmt: skip


def split_all(chunks: list[str], max_line: int = 8) -> list[tuple[str, bool]]:
    got: list[tuple[str, bool]] = []
    splitter = LineSplitter(lambda text, cont: got.append((text, cont)), max_line=max_line)
    for c in chunks:
        splitter.feed(c)
    splitter.flush()
    return got


@given(st.lists(st.text(alphabet="ab\nc", max_size=30), max_size=12))
def test_splitter_pieces_rejoin_to_the_input_lines(chunks: list[str]) -> None:
    got = split_all(chunks)
    rebuilt = "".join(text + ("" if cont else "\n") for text, cont in got)
    data = "".join(chunks)
    assert rebuilt == (data if data.endswith("\n") or not data else data + "\n")
    assert all(len(text) <= 8 + 30 for text, _ in got)
    assert all(len(text) == 8 for text, cont in got if cont)


@given(st.lists(st.text(alphabet="xy\n", max_size=40), max_size=12), st.integers(0, 50))
def test_tail_keeps_the_last_characters_and_counts_the_rest(chunks: list[str], limit: int) -> None:
    tail = StreamTail(limit)
    for c in chunks:
        tail.add(c)
    data = "".join(chunks)
    assert tail.text() == data[max(0, len(data) - limit) :]
    assert tail.dropped == max(0, len(data) - limit)


def test_a_command_given_up_on_has_its_output_dropped_unread() -> None:
    # A cancelled command's output keeps coming while its kill runs; decoding
    # and sending it on as lines kept the event loop from the kill's timers.
    lines: list[OutputLine] = []
    session = CommandSession("h1", lines.append, 1000)
    session.data_received(b"kept\n", None)
    session.discard()
    session.data_received(b"dropped\nhalf", None)
    session.connection_lost(None)
    assert [line.line for line in lines] == ["kept"]
    assert session.closed.is_set()
    assert session.result("failed", None, None, 0.0).stdout == "kept"


def test_result_text_drops_one_trailing_newline_like_joined_lines() -> None:
    tail = StreamTail(100)
    tail.add("a\nb\n")
    assert as_result_text(tail) == "a\nb"


def test_a_truncated_result_says_how_much_was_dropped() -> None:
    r = HostResult("n1", "ok", stdout="tail", stdout_dropped=5, output_file="/r/logs/s/n1.log")
    assert r.truncated
    assert r.to_dict()["dropped"] == {"stdout": 5, "stderr": 0}
    assert not HostResult("n1", "ok").truncated


@pytest.mark.parametrize(
    "value",
    ["plain", 'it\'s "quoted" $HOME `x`', "two\nlines\n", "", "token-like 0123456789abcdef0123"],
)
def test_env_block_reaches_the_command_and_leaves_the_rest_of_stdin(value: str) -> None:
    token = "0123456789abcdef01234567"
    script = env_reader(token) + 'printf "%s|" "$SECRET"; cat'
    stdin = env_block({"SECRET": value}, token) + "payload\n"
    out = subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, text=True)
    assert out.stdout == f"{value}|payload\n"
    assert value not in script or not value


def test_env_block_refuses_a_bad_name() -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        env_block({"A B": "x"}, "0123456789abcdef01234567")


def test_recorder_streams_output_lines_into_private_per_host_logs(tmp_path: Path) -> None:
    rec = RunRecorder.create(tmp_path / "run")
    sink = rec.events_sink()
    rec.begin_step("build", ["n1"])
    sink.emit(OutputLine(host="n1", stream="stdout", line="a" * 4, continues=True))
    sink.emit(OutputLine(host="n1", stream="stdout", line="b"))
    sink.emit(OutputLine(host="n2", stream="stdout", line="not in a step"))
    result = rec.end_log("build", HostResult("n1", "failed", exit_code=2, error="exit code 2"))
    rec.close()
    log = rec.log_path("build", "n1")
    assert log.read_text() == "aaaab\n[cvs] failed: exit code 2\n"
    assert result.output_file == str(log)
    assert log.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    assert not rec.log_path("build", "n2").exists()


def test_recorder_write_failure_is_remembered_once_and_reported(tmp_path: Path) -> None:
    rec = RunRecorder.create(tmp_path / "run")
    calls: list[int] = []
    rec.on_failure = lambda: calls.append(1)
    # Root ignores file modes: a file where the step's log directory goes fails for anyone.
    (tmp_path / "run" / "logs" / "build").write_text("a file where the step dir goes")
    rec.begin_step("build", ["n1"])
    rec.events_sink().emit(OutputLine(host="n1", stream="stdout", line="x"))
    assert calls == [1]
    assert rec.failure is not None and str(tmp_path / "run" / "logs" / "build") in str(rec.failure)
    rec.finish(a_run_outcome(), report=write_report)  # nothing more is attempted after a failure
    assert not (tmp_path / "run" / "results.json").exists()
