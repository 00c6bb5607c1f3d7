"""Turning results and events into what a person reads."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.config.hostlist import compress_hostlist as compress_hosts
from orchestrator.events import (
    CommandFinished,
    CommandStarted,
    Connected,
    ConnectFailed,
    Connecting,
    Event,
    HostStep,
    Message,
    OutputLine,
)
from orchestrator.results import HostResult

if TYPE_CHECKING:
    from orchestrator.containers.status import HostStatus


def group_results(results: Mapping[str, HostResult]) -> list[tuple[list[str], HostResult]]:
    """Hosts with identical output and status folded together, like `dshbak -c`."""
    buckets: dict[tuple[str, str, str, int | None], list[str]] = {}
    sample: dict[tuple[str, str, str, int | None], HostResult] = {}
    for host, r in results.items():
        key = (r.status, r.stdout, r.stderr, r.exit_code)
        buckets.setdefault(key, []).append(host)
        sample.setdefault(key, r)
    return [(hosts, sample[k]) for k, hosts in buckets.items()]


def print_grouped(results: Mapping[str, HostResult], out: IO[str] = sys.stdout) -> None:
    for hosts, r in group_results(results):
        title = f"{compress_hosts(hosts)} ({len(hosts)}) {r.status}"
        if r.exit_code not in (None, 0):
            title += f" exit {r.exit_code}"
        if r.error and r.status != "failed":
            title += f": {r.error}"
        bar = "-" * min(max(len(title), 16), 78)
        out.write(f"{bar}\n{title}\n{bar}\n")
        body = "\n".join(x for x in (r.stdout, r.stderr) if x)
        if body:
            out.write(body + "\n")


def summary_line(results: Mapping[str, HostResult]) -> str:
    counts: dict[str, int] = {}
    for r in results.values():
        counts[r.status] = counts.get(r.status, 0) + 1
    order = ["ok", "failed", "timeout", "unreachable", "auth", "host_key"]
    parts = [f"{counts[s]} {s}" for s in order if s in counts]
    return f"{len(results)} host{'s' if len(results) != 1 else ''}: " + ", ".join(parts)


class RichSink:
    """A live table on a terminal: one row per host with its latest state."""

    def __init__(
        self, console: Console | None = None, *, verbose: bool = False, output: bool = True
    ) -> None:
        self.console = console or Console(stderr=True)
        self.verbose = verbose
        self.output = output
        self.rows: dict[str, tuple[str, str]] = {}
        self.started = time.monotonic()
        self.live = Live(self._table(), console=self.console, transient=True, auto_refresh=False)
        self.live.start()

    def _table(self) -> Table:
        table = Table.grid(padding=(0, 2))
        for host, (state, last) in list(self.rows.items())[-40:]:
            table.add_row(Text(host, style="bold"), Text(state), Text(last[-100:], style="dim"))
        return table

    def _set(self, host: str, state: str, last: str | None = None) -> None:
        prev = self.rows.get(host, ("", ""))
        self.rows[host] = (state, prev[1] if last is None else last)
        self.live.update(self._table(), refresh=True)

    def emit(self, event: Event) -> None:
        match event:
            case Connecting(host=h):
                self._set(h, "[cyan]connecting")
            case Connected(host=h):
                self._set(h, "[cyan]connected")
            case ConnectFailed(host=h, status=s, error=e):
                self._set(h, f"[red]{s}", e)
                self.console.print(f"[red]{h}[/] ! {s}: {e}")
            case CommandStarted(host=h):
                self._set(h, "[yellow]running")
            case OutputLine(host=h, line=line) if self.output:
                self.live.console.print(Text(f"{h} | ", style="bold") + Text(line))
                self._set(h, self.rows.get(h, ("running", ""))[0], line)
            case CommandFinished(host=h, result=r):
                style = "green" if r.ok else "red"
                self._set(h, f"[{style}]{r.status}")
            case HostStep(host=h, step=step, status=status, detail=detail):
                style = {"ok": "green", "failed": "red", "skipped": "dim"}.get(status, "yellow")
                self._set(h, f"[{style}]{step} {status}", detail or None)
                if status == "failed":
                    self.console.print(f"[red]{h}[/] ! {step}: {detail}")
            case Message(level=level, text=text, host=host):
                style = {"warning": "yellow", "error": "red"}.get(level, "")
                prefix = f"{host}: " if host else ""
                self.console.print(Text(f"{prefix}{text}", style=style))

    def close(self) -> None:
        self.live.stop()


STATUS_HEADERS = [
    "host",
    "reachable",
    "docker",
    "state",
    "image",
    "tag",
    "stale",
    "sshd",
    "provisioned",
    "limits",
    "drift",
]


def status_cells(status: HostStatus) -> list[str]:
    """One `cvs status` table row: the `--json` row's values, limits and drift folded."""
    row = status.to_dict()
    hard_limits = {k: v for k, v in status.limits.items() if k in ("cpus", "memory", "pids")}
    cells = {
        **{k: "yes" if v is True else "no" if v is False else str(v) for k, v in row.items()},
        "limits": " ".join(f"{k}={v}" for k, v in hard_limits.items()) or "-",
        "drift": "; ".join(status.drift) or "-",
    }
    return [cells[h] for h in STATUS_HEADERS]


def print_status(rows: Sequence[HostStatus], *, plain: bool) -> None:
    """The `cvs status` table; probe errors follow on stderr, one line per host."""
    if plain:
        data = [STATUS_HEADERS] + [status_cells(r) for r in rows]
        widths = [max(len(r[i]) for r in data) for i in range(len(STATUS_HEADERS))]
        for r in data:
            sys.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n"
            )
    else:
        table = Table(*STATUS_HEADERS)
        for r in rows:
            table.add_row(*status_cells(r))
        Console().print(table)
    for r in rows:
        if r.error:
            sys.stderr.write(f"{r.host}: {r.error}\n")


# ---- cvs status -o table|wide: a colour-coded table -------------------------------------

# The default table; `-o wide` shows every STATUS_HEADERS column.
STATUS_NARROW = ["host", "reachable", "state", "image", "stale", "sshd", "provisioned", "drift"]
# Cell text -> style, per column: green is what a run wants, red what stops it.
STATUS_STYLES: dict[str, dict[str, str]] = {
    "reachable": {"yes": "green", "no": "bold red"},
    "state": {
        "running": "green",
        "exited": "yellow",
        "paused": "yellow",
        "created": "yellow",
        "restarting": "yellow",
        "absent": "dim",
        "unknown": "bold red",
        "dead": "bold red",
    },
    "stale": {"yes": "yellow", "no": "dim"},
    "sshd": {"listening": "green", "down": "red", "off": "dim"},
    "provisioned": {"yes": "green", "no": "yellow"},
    "docker": {"?": "red"},
}


def status_columns(*, wide: bool) -> list[str]:
    return list(STATUS_HEADERS) if wide else list(STATUS_NARROW)


def status_table(rows: Sequence[HostStatus], *, wide: bool = False) -> Table:
    """`cvs status` as a rich table, state and health colour-coded per cell."""
    columns = status_columns(wide=wide)
    table = Table(*columns, header_style="bold")
    for row in rows:
        cells = dict(zip(STATUS_HEADERS, status_cells(row), strict=True))
        if not wide and cells["drift"] != "-":
            cells["drift"] = f"{len(row.drift)} (-o wide)"
        rendered = []
        for column in columns:
            text = cells[column]
            style = STATUS_STYLES.get(column, {}).get(text, "")
            if column == "drift" and text != "-":
                style = "yellow"
            if column == "provisioned" and text.startswith("other"):
                style = "yellow"
            rendered.append(Text(text, style=style))
        table.add_row(*rendered)
    return table


def print_status_table(
    rows: Sequence[HostStatus],
    *,
    wide: bool,
    plain: bool,
    out: IO[str] | None = None,
) -> None:
    """The `cvs status` table on stdout: rich and coloured on a terminal, aligned text
    otherwise (pipes, CI, NO_COLOR); probe errors follow on stderr."""
    out = out or sys.stdout
    if plain:
        columns = status_columns(wide=wide)
        index = [STATUS_HEADERS.index(c) for c in columns]
        data = [columns] + [[status_cells(r)[i] for i in index] for r in rows]
        widths = [max(len(r[i]) for r in data) for i in range(len(columns))]
        for line in data:
            cells = (c.ljust(w) for c, w in zip(line, widths, strict=True))
            out.write("  ".join(cells).rstrip() + "\n")
    else:
        Console(file=out).print(status_table(rows, wide=wide))
    for r in rows:
        if r.error:
            sys.stderr.write(f"{r.host}: {r.error}\n")
