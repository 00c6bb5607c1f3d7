"""The live view: a bounded redraw rate whatever the output volume, and a
progress summary (not a line per host) for a large fleet."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from orchestrator.events import CommandFinished, CommandStarted, ConnectFailed, OutputLine
from orchestrator.render.live import LIVE_HZ, RichSink, progress_lines
from orchestrator.results import HostResult


def terminal(buffer: io.StringIO) -> Console:
    return Console(file=buffer, force_terminal=True, width=120)


def test_thousands_of_output_lines_cost_a_bounded_number_of_redraws() -> None:
    out, err = io.StringIO(), io.StringIO()
    sink = RichSink(terminal(out), err_console=terminal(err))
    started = time.monotonic()
    for n in range(20000):
        sink.emit(OutputLine(host=f"node{n % 2 + 1}", stream="stdout", line=f"line {n}"))
    time.sleep(0.3)
    sink.close()
    elapsed = time.monotonic() - started
    assert sink.redraws <= elapsed * LIVE_HZ + 3
    text = out.getvalue()
    assert "node1 | line 0" in text and "node2 | line 19999" in text


def test_a_thousand_hosts_get_a_summary_with_failures_grouped_by_error() -> None:
    out = io.StringIO()
    sink = RichSink(terminal(out), err_console=terminal(io.StringIO()))
    for n in range(1000):
        sink.emit(CommandStarted(host=f"lo{n + 1}", command="true"))
    for n in range(900):
        sink.emit(CommandFinished(host=f"lo{n + 1}", result=HostResult(f"lo{n + 1}", "ok")))
    for n in range(900, 950):
        sink.emit(
            ConnectFailed(host=f"lo{n + 1}", status="unreachable", error="connection refused")
        )
    lines = [line.plain for line in progress_lines(sink.hosts, now=time.monotonic())]
    sink.close()
    assert lines[0] == "1000 hosts: 950 done (900 ok, 50 failed) · 50 running · 0 connecting"
    assert lines[1].startswith("slowest: lo951 ")
    assert lines[2] == "50 failed: unreachable: connection refused (lo[901-950])"
    assert len(lines) == 3


def test_up_report_for_a_large_fleet_folds_hosts_with_the_same_outcome(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli.cluster import _write_host_lines

    lines = {f"lo{n}": "attach ok (probe)" for n in range(1, 1000)}
    lines["lo1000"] = "cold FAILED at run: exit code 125"
    _write_host_lines(lines)
    assert capsys.readouterr().out.splitlines() == [
        "lo[1-999] (999): attach ok (probe)",
        "lo1000 (1): cold FAILED at run: exit code 125",
    ]


def test_five_thousand_hosts_get_a_bounded_summary_that_counts_every_failure() -> None:
    out = io.StringIO()
    sink = RichSink(terminal(out), err_console=terminal(io.StringIO()))
    hosts = [f"gpu{n:04d}" for n in range(1, 5001)]
    for h in hosts:
        sink.emit(CommandStarted(host=h, command="true"))
    for h in hosts[:4000]:
        sink.emit(CommandFinished(host=h, result=HostResult(h, "ok")))
    for h in hosts[4000:4600]:
        sink.emit(ConnectFailed(host=h, status="unreachable", error="connection refused"))
    # 300 hosts whose errors are all different (a command's own message).
    for n, h in enumerate(hosts[4600:4900]):
        sink.emit(
            CommandFinished(host=h, result=HostResult(h, "failed", exit_code=1, error=f"e{n}"))
        )
    lines = [line.plain for line in progress_lines(sink.hosts, now=time.monotonic())]
    sink.close()
    assert lines[0] == "5000 hosts: 4900 done (4000 ok, 900 failed) · 100 running · 0 connecting"
    assert lines[2] == "600 failed: unreachable: connection refused (gpu[4001-4600])"
    # Five groups shown, the other 296 hosts counted in one line: 8 lines in all.
    assert lines[-1] == "296 more failed with 296 other errors"
    assert len(lines) == 8
    # What one redraw costs at this size is measured in bench/live_view.py, not
    # here: on a shared 2-core machine the load decides wall time (issue 30).


def test_the_report_folds_hosts_by_error_too_not_by_status_alone() -> None:
    from orchestrator.render import print_grouped

    results = {
        f"lo{n}": HostResult(f"lo{n}", "unreachable", error="connection refused (x)")
        for n in range(1, 4001)
    }
    for n in range(4001, 5001):
        results[f"lo{n}"] = HostResult(f"lo{n}", "unreachable", error="connect timed out (y)")
    out = io.StringIO()
    print_grouped(results, out)
    titles = [line for line in out.getvalue().splitlines() if not line.startswith("-")]
    assert titles == [
        "lo[1-4000] (4000) unreachable: connection refused (x)",
        "lo[4001-5000] (1000) unreachable: connect timed out (y)",
    ]
