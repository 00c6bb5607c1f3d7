"""Turning results and events into what a person reads."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from orchestrator.config.hostlist import compress_hostlist
from orchestrator.errors import API_STYLE, Call, Phrase, Style, say
from orchestrator.errors import Text as Said
from orchestrator.errortext import SeenErrors, fold_errors
from orchestrator.events import (
    CommandFinished,
    CommandStarted,
    Connected,
    ConnectFailed,
    Connecting,
    Event,
    HostStep,
    ImageProgress,
    Message,
    OutputLine,
    in_words,
    progress_text,
)
from orchestrator.results import HostResult

if TYPE_CHECKING:
    # rich is imported where a rich view is drawn, not here: plain output (a
    # pipe, a file, `--json`) never loads it (tests/test_startup.py).
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

    from orchestrator.containers.status import HostStatus

# Host lists folded the Slurm way (`gpu[01-04]`); the commands use it too.
compress_hosts = compress_hostlist


def group_results(results: Mapping[str, HostResult]) -> list[tuple[list[str], HostResult]]:
    """Hosts with identical output, status and error folded together, like
    `dshbak -c` (the error too: a refused host and a timed-out one are both
    `unreachable`, and a group shows one sample's error)."""
    buckets: dict[tuple[str, str, str, int | None, Said | None], list[str]] = {}
    sample: dict[tuple[str, str, str, int | None, Said | None], HostResult] = {}
    for host, r in results.items():
        key = (r.status, r.stdout, r.stderr, r.exit_code, r.error)
        buckets.setdefault(key, []).append(host)
        sample.setdefault(key, r)
    return [(hosts, sample[k]) for k, hosts in buckets.items()]


def print_grouped(results: Mapping[str, HostResult], out: IO[str] = sys.stdout) -> None:
    for hosts, r in group_results(results):
        title = f"{compress_hosts(hosts)} ({len(hosts)}) {r.status}"
        if r.exit_code not in (None, 0):
            title += f" exit {r.exit_code}"
        if r.error and r.status != "failed":
            title += f": {r.error!s}"
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


# The live view redraws at most this often, whatever the output volume: output
# lines are batched and printed above it once per tick.
LIVE_HZ = 10
# Above this many hosts the live view is a progress summary, not a row per host.
ROWS_MAX = 20
# Output waiting for the next tick beyond this is printed at once (bounded memory).
PENDING_MAX = 1 << 20


@dataclass
class _HostView:
    """One host's row in the live view."""

    state: str = "[cyan]connecting"
    last: str = ""
    phase: str = "connecting"  # connecting | running | ok | failed
    since: float = field(default_factory=time.monotonic)
    error: str = ""


class _Live:
    """What Live renders: built at draw time from the sink's current state."""

    def __init__(self, sink: RichSink) -> None:
        self.sink = sink

    def __rich__(self) -> RenderableType:
        return self.sink.view()


class RichSink:
    """The live view on a terminal (stdout): a row per host, or for a large
    fleet a progress summary (done / running / failed, slowest hosts, failures
    grouped by identical error). Host output is printed above it.

    Drawing happens on one background thread at most `LIVE_HZ` times a second;
    `emit` only records state and queues output, so the cost of a chatty
    command does not grow with redraws. cvs's own messages go to stderr, or
    above the view when stderr is the same terminal.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        err_console: Console | None = None,
        verbose: bool = False,
        output: bool = True,
    ) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        self.console = console or Console()
        self.err = err_console or Console(stderr=True)
        self.verbose = verbose
        self.output = output
        self.hosts: dict[str, _HostView] = {}
        # Errors already printed: the same one on the next host is a pointer.
        self.seen = SeenErrors()
        # False when the command reports connect failures itself (`cvs status`).
        self.connect_failures = True
        self.style: Style = API_STYLE  # whose words its messages are in (the CLI sets its own)
        self.redraws = 0
        self._inline = self.err.is_terminal and self.console.is_terminal
        self._lock = threading.RLock()
        self._pending = Text()
        self._pending_chars = 0
        self._stop = threading.Event()
        self.live = Live(_Live(self), console=self.console, transient=True, auto_refresh=False)
        self.live.start()
        self._thread = threading.Thread(target=self._tick, name="cvs-live", daemon=True)
        self._thread.start()

    # -- state, from the event loop ------------------------------------------

    def _host(self, host: str) -> _HostView:
        view = self.hosts.get(host)
        if view is None:
            view = self.hosts[host] = _HostView()
        return view

    def _set(self, host: str, state: str, phase: str, last: str | None = None) -> None:
        view = self._host(host)
        if phase == "running" and view.phase != "running":
            view.since = time.monotonic()
        view.state, view.phase = state, phase
        if last is not None:
            view.last = last

    def _queue(self, text: Text) -> None:
        with self._lock:
            self._pending.append_text(text)
            self._pending.append("\n")
            self._pending_chars += len(text)
            if self._pending_chars > PENDING_MAX:
                self._flush()

    def _say(self, text: Text) -> None:
        """One of cvs's own messages."""
        if self._inline:
            self._queue(text)
        else:
            with self._lock:
                self.err.print(text)

    def emit(self, event: Event) -> None:
        event = in_words(event, self.style)
        with self._lock:
            self._emit(event)

    def _emit(self, event: Event) -> None:
        from rich.text import Text

        match event:
            case Connecting(host=h):
                self._set(h, "[cyan]connecting", "connecting")
            case Connected(host=h):
                self._set(h, "[cyan]connected", "connecting")
            case ConnectFailed(host=h, status=s, error=e):
                self._set(h, f"[red]{s}", "failed", e)
                self._host(h).error = f"{s}: {e}"
                if len(self.hosts) <= ROWS_MAX and self.connect_failures:
                    line = self.seen.line(h, f"{s}: {e}")
                    self._say(Text.from_markup(f"[red]{h}[/] ! ") + Text(line))
            case CommandStarted(host=h):
                self._set(h, "[yellow]running", "running")
            case OutputLine(host=h, line=line) if self.output:
                self._queue(Text(f"{h} | ", style="bold") + Text(line))
                self._host(h).last = line[-200:]
            case CommandFinished(host=h, result=r):
                if r.ok:
                    self._set(h, f"[green]{r.status}", "ok")
                else:
                    self._set(h, f"[red]{r.status}", "failed")
                    self._host(h).error = (
                        f"{r.status}: {say(r.error, self.style)}" if r.error else r.status
                    )
            case HostStep(host=h, step=step, status=status, detail=detail):
                style = {"ok": "green", "failed": "red", "skipped": "dim"}.get(status, "yellow")
                phase = {"started": "running", "ok": "ok", "skipped": "ok"}.get(status, "failed")
                self._set(h, f"[{style}]{step} {status}", phase, say(detail, self.style) or None)
                if status == "failed":
                    self._host(h).error = f"{step}: {detail}"
                    if len(self.hosts) <= ROWS_MAX:
                        line = self.seen.line(h, f"{step}: {detail}")
                        self._say(Text.from_markup(f"[red]{h}[/] ! ") + Text(line))
            case ImageProgress(host=h, done=done, total=total, rate=rate, eta=eta):
                self._set(h, "[yellow]image", "running", progress_text(done, total, rate, eta))
            case Message(level=level, text=text, host=host):
                style = {"warning": "yellow", "error": "red"}.get(level, "")
                prefix = f"{host}: " if host else ""
                self._say(Text(f"{prefix}{text}", style=style))

    # -- drawing, on the live thread --------------------------------------------

    def _flush(self) -> None:
        """Print queued output above the view (one redraw), else just redraw."""
        from rich.text import Text

        with self._lock:
            pending, self._pending, self._pending_chars = self._pending, Text(), 0
            if pending:
                pending.rstrip()
                self.live.console.print(pending, soft_wrap=True)
            else:
                self.live.refresh()
            self.redraws += 1

    def _tick(self) -> None:
        while not self._stop.wait(1 / LIVE_HZ):
            self._flush()

    def view(self) -> RenderableType:
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            if len(self.hosts) <= ROWS_MAX:
                table = Table.grid(padding=(0, 2))
                for host, v in self.hosts.items():
                    table.add_row(
                        Text(host, style="bold"),
                        Text.from_markup(v.state),
                        Text(v.last[-100:], style="dim"),
                    )
                return table
            return Text("\n").join(progress_lines(self.hosts, now=time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._flush()
        self.live.stop()


def progress_lines(hosts: Mapping[str, _HostView], *, now: float, top: int = 5) -> list[Text]:
    """The summary a large fleet gets instead of a row per host."""
    from rich.text import Text

    phases: dict[str, list[str]] = {}
    for host, v in hosts.items():
        phases.setdefault(v.phase, []).append(host)
    done = len(phases.get("ok", [])) + len(phases.get("failed", []))
    head = Text(f"{len(hosts)} hosts: ", style="bold")
    head.append(f"{done} done ")
    head.append(f"({len(phases.get('ok', []))} ok, ", style="green")
    head.append(f"{len(phases.get('failed', []))} failed)", style="red")
    head.append(f" · {len(phases.get('running', []))} running")
    head.append(f" · {len(phases.get('connecting', []))} connecting")
    lines = [head]
    running = sorted(phases.get("running", []), key=lambda h: hosts[h].since)[:top]
    if running:
        slow = ", ".join(f"{h} {now - hosts[h].since:.1f}s" for h in running)
        lines.append(Text(f"slowest: {slow}", style="yellow"))
    groups = failure_groups({h: hosts[h].error for h in phases.get("failed", [])})
    for hosts_with, error in groups[:top]:
        lines.append(
            Text(f"{len(hosts_with)} failed: {error} ({compress_hosts(hosts_with)})", style="red")
        )
    if len(groups) > top:
        # Bounded whatever the fleet, and nothing left out unsaid.
        rest = groups[top:]
        lines.append(
            Text(
                f"{sum(len(hs) for hs, _ in rest)} more failed with "
                f"{len(rest)} other error{'s' if len(rest) > 1 else ''}",
                style="red",
            )
        )
    return lines


def failure_groups(
    errors: Mapping[str, str], aliases: Mapping[str, Sequence[str]] | None = None
) -> list[tuple[list[str], str]]:
    """Hosts that failed with the same error, largest group first: the same once
    host names and addresses (`aliases`: per host, its address and VPC
    address), container IDs and docker's usage hints are set aside
    (`errortext.fold_errors`)."""
    return fold_errors(errors, aliases)


STATUS_HEADERS = [
    "host",
    "reachable",
    "access",
    "state",
    "image",
    "tag",
    "stale",
    "sshd",
    "provisioned",
    "limits",
    "drift",
]


# A cell whose value could not be probed (null in `--json`); explained once under the table.
UNKNOWN = "?"
UNKNOWN_NOTE = "? in the table: not known, for this reason"


def _cell(value: object) -> str:
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def status_cells(status: HostStatus) -> list[str]:
    """One `cvs status` table row: the `--json` row's values (null as `?`, no
    container as `-`), limits and drift folded."""
    row = status.to_dict()
    hard_limits = {k: v for k, v in status.limits.items() if k in ("cpus", "memory", "pids")}
    cells = {k: _cell(v) for k, v in row.items()}  # state stays "unknown": the word says it
    if status.probed:
        for key in ("image", "tag"):
            cells[key] = "-" if row[key] is None else cells[key]  # no container / no tag
    cells["limits"] = " ".join(f"{k}={v}" for k, v in hard_limits.items()) or "-"
    cells["drift"] = ("; ".join(status.drift) or "-") if status.probed else UNKNOWN
    return [cells[h] for h in STATUS_HEADERS]


def _status_errors(
    rows: Sequence[HostStatus], out: IO[str] | None = None, style: Style = API_STYLE
) -> None:
    """Each host's reason on stderr, `HOST: reason`; the first one also says
    what the table's `?` means (once: the table's rows stay one per host)."""
    explained = False
    for r in rows:
        init = r.init_note()
        if init is not None:
            sys.stderr.write(f"{r.host}: note: {init}\n")
        if r.error:
            note = ""
            if not explained and (not r.probed or r.access is None):
                note, explained = f"; {UNKNOWN_NOTE}", True
            sys.stderr.write(f"{r.host}: {r.error!s}{note}\n")
            continue
        # No error, yet a `?` (an exited container: no sshd or marker to ask): why.
        cells = dict(zip(STATUS_HEADERS, status_cells(r), strict=True))
        unknown = [k for k in STATUS_NARROW if cells[k] == UNKNOWN]
        if unknown:
            state = cells["state"]
            why: Said = (
                Phrase(
                    f"not known while the container is {state} (", Call("up"), " starts it again)"
                )
                if state != "running"
                else "not known: the probe could not tell"
            )
            said = why.render(style) if isinstance(why, Phrase) else why
            sys.stderr.write(f"{r.host}: {', '.join(unknown)} {said}\n")


def print_status(rows: Sequence[HostStatus], *, plain: bool, style: Style = API_STYLE) -> None:
    """The `cvs status` table; probe errors follow on stderr, one line per host."""
    if plain:
        data = [_header_labels(STATUS_HEADERS, rows)] + [status_cells(r) for r in rows]
        widths = [max(len(r[i]) for r in data) for i in range(len(STATUS_HEADERS))]
        for line in data:
            sys.stdout.write(
                "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n"
            )
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(*STATUS_HEADERS)
        for r in rows:
            table.add_row(*status_cells(r))
        Console().print(table)
    _status_errors(rows, style=style)


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
}


def status_columns(*, wide: bool) -> list[str]:
    return list(STATUS_HEADERS) if wide else list(STATUS_NARROW)


def _header_labels(columns: Sequence[str], rows: Sequence[HostStatus]) -> list[str]:
    """Column headers as shown: the access column is named for the cluster's
    runtime (`podman` on a podman cluster; the cells' keys stay the same)."""
    runtimes = {r.runtime for r in rows}
    access = runtimes.pop() if len(runtimes) == 1 else "docker"
    return [access if c == "access" else c for c in columns]


def status_table(rows: Sequence[HostStatus], *, wide: bool = False) -> Table:
    """`cvs status` as a rich table, state and health colour-coded per cell."""
    from rich.table import Table
    from rich.text import Text

    columns = status_columns(wide=wide)
    table = Table(*_header_labels(columns, rows), header_style="bold")
    for row in rows:
        cells = dict(zip(STATUS_HEADERS, status_cells(row), strict=True))
        if not wide and cells["drift"] not in ("-", UNKNOWN):
            cells["drift"] = f"{len(row.drift)} (-o wide)"
        rendered = []
        for column in columns:
            text = cells[column]
            style = STATUS_STYLES.get(column, {}).get(text, "")
            if text == UNKNOWN:
                style = "bold red"
            elif column == "drift" and text != "-":
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
    style: Style = API_STYLE,
) -> None:
    """The `cvs status` table on stdout: rich and coloured on a terminal, aligned text
    otherwise (pipes, CI, NO_COLOR); probe errors follow on stderr (calls named
    in `style`'s words)."""
    out = out or sys.stdout
    if plain:
        columns = status_columns(wide=wide)
        index = [STATUS_HEADERS.index(c) for c in columns]
        data = [_header_labels(columns, rows)] + [[status_cells(r)[i] for i in index] for r in rows]
        widths = [max(len(r[i]) for r in data) for i in range(len(columns))]
        for line in data:
            cells = (c.ljust(w) for c, w in zip(line, widths, strict=True))
            out.write("  ".join(cells).rstrip() + "\n")
    else:
        from rich.console import Console

        Console(file=out).print(status_table(rows, wide=wide))
    _status_errors(rows, out, style)


# ---- cvs exec --group on a terminal: one coloured header per group -----------------------


def group_header(hosts: Sequence[str], result: HostResult) -> Text:
    """`node[01-12,14] (13) ok`: the hostlist, the count and the outcome, coloured by it."""
    from rich.text import Text

    style = "bold green" if result.ok else "bold red"
    header = Text(compress_hosts(hosts), style="bold cyan") + Text(f" ({len(hosts)}) ")
    outcome = result.status + (
        f" exit {result.exit_code}" if result.exit_code not in (None, 0) else ""
    )
    if result.error and result.status != "failed":
        outcome += f": {result.error!s}"
    return header + Text(outcome, style=style)


def print_grouped_rich(results: Mapping[str, HostResult], console: Console | None = None) -> None:
    """`print_grouped` for a terminal: a rule with the group header, then its output as is."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    for hosts, r in group_results(results):
        console.rule(group_header(hosts, r), align="left", style="dim")
        body = "\n".join(x for x in (r.stdout, r.stderr) if x)
        if body:
            console.print(Text(body), highlight=False)
