"""Turning results and events into what a person reads, as plain text.

The views drawn with rich (the live view, the coloured tables) are in
`render.live`: plain output (a pipe, a file, `--json`) never loads rich
(tests/test_startup.py)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING

from orchestrator.config.hostlist import compress_hostlist
from orchestrator.errors import API_STYLE, Call, Phrase, Style
from orchestrator.errors import Text as Said
from orchestrator.errortext import fold_errors
from orchestrator.results import HostResult

if TYPE_CHECKING:
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


def print_status_lines(
    rows: Sequence[HostStatus],
    *,
    wide: bool,
    out: IO[str] | None = None,
    style: Style = API_STYLE,
) -> None:
    """The `cvs status` table as aligned text (pipes, CI, NO_COLOR); probe
    errors follow on stderr (calls named in `style`'s words)."""
    out = out or sys.stdout
    columns = status_columns(wide=wide)
    index = [STATUS_HEADERS.index(c) for c in columns]
    data = [_header_labels(columns, rows)] + [[status_cells(r)[i] for i in index] for r in rows]
    widths = [max(len(r[i]) for r in data) for i in range(len(columns))]
    for line in data:
        cells = (c.ljust(w) for c, w in zip(line, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")
    _status_errors(rows, out, style)
