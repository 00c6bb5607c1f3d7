"""The views drawn with rich: the live view on a terminal (`RichSink`), the
coloured `cvs status` table, `cvs exec --group`'s headers. Imported only
where output goes to a terminal (tests/test_startup.py)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.errors import API_STYLE, Style, say
from orchestrator.errortext import SeenErrors
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
from orchestrator.render import (
    STATUS_HEADERS,
    STATUS_STYLES,
    UNKNOWN,
    _header_labels,
    _status_errors,
    compress_hosts,
    failure_groups,
    group_results,
    print_status_lines,
    status_cells,
    status_columns,
)
from orchestrator.results import HostResult

if TYPE_CHECKING:
    from orchestrator.containers.status import HostStatus


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


def status_table(rows: Sequence[HostStatus], *, wide: bool = False) -> Table:
    """`cvs status` as a rich table, state and health colour-coded per cell."""

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
    if plain:
        print_status_lines(rows, wide=wide, out=out, style=style)
        return
    out = out or sys.stdout
    Console(file=out).print(status_table(rows, wide=wide))
    _status_errors(rows, out, style)


# ---- cvs exec --group on a terminal: one coloured header per group -----------------------


def group_header(hosts: Sequence[str], result: HostResult) -> Text:
    """`node[01-12,14] (13) ok`: the hostlist, the count and the outcome, coloured by it."""
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

    console = console or Console()
    for hosts, r in group_results(results):
        console.rule(group_header(hosts, r), align="left", style="dim")
        body = "\n".join(x for x in (r.stdout, r.stderr) if x)
        if body:
            console.print(Text(body), highlight=False)
