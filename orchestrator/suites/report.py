"""What a person reads about a run: the text table printed at the end, and report.html.

Both are pure functions of a `RunOutcome`. The HTML is rendered with Jinja2
(autoescape on: host output is untrusted text) from `templates/report.html.j2`
and is self-contained: inline CSS, no script, no fetches (a CSP meta tag says
so to the browser).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from orchestrator.config.hostlist import compress_hostlist
from orchestrator.suites.records import RunOutcome, StepOutcome, utc_stamp

# Above this many hosts a step's text row names hosts per status instead of one column per host.
WIDE_TABLE_HOSTS = 8
REPORT_TAIL_LINES = 40
# Past this many hosts the matrix turns: one row per host, one column per step.
HOSTS_AS_COLUMNS_MAX = 12
TEMPLATE = "report.html.j2"

VERDICTS = {0: "ok", 3: "host unreachable", 4: "refused", 130: "interrupted"}


def verdict_word(outcome: RunOutcome) -> str:
    return VERDICTS.get(int(outcome.exit_code), "failed")


def run_seconds(outcome: RunOutcome) -> float:
    finished = outcome.finished or outcome.started
    return (finished - outcome.started).total_seconds()


def run_hosts(outcome: RunOutcome) -> list[str]:
    """Every host any step ran on (or was meant to), in first-seen order."""
    hosts: list[str] = []
    for s in outcome.steps:
        hosts.extend(h for h in s.results if h not in hosts)
    return hosts


# ---- text ---------------------------------------------------------------------------


def _cell(step: StepOutcome, host: str) -> str:
    r = step.results.get(host)
    if r is None:
        return "-"
    if r.status == "failed" and r.exit_code not in (None, 0):
        return f"FAILED (exit {r.exit_code})"
    return r.status.upper() if r.status in ("failed", "timeout", "interrupted") else r.status


def summary_rows(outcome: RunOutcome) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the step x host table; folded per status for wide fleets."""
    hosts = run_hosts(outcome)
    if len(hosts) <= WIDE_TABLE_HOSTS:
        rows = [[s.name] + [_cell(s, h) for h in hosts] for s in outcome.steps]
        return ["step", *hosts], rows
    rows = []
    for s in outcome.steps:
        by_status: dict[str, list[str]] = {}
        for h, r in s.results.items():
            by_status.setdefault(r.status, []).append(h)
        text = "  ".join(f"{st}: {compress_hostlist(hs)}" for st, hs in by_status.items())
        rows.append([s.name, s.status, text])
    return ["step", "status", "hosts"], rows


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines) + "\n"


def failure_report(outcome: RunOutcome, tail_lines: int = 10) -> str:
    """Per failing host: the step, the status and reason, and the last lines of output."""
    out: list[str] = []
    for s in outcome.steps:
        for h, r in s.results.items():
            if r.ok or r.status in ("skipped", "interrupted"):
                continue
            out.append(f"{s.name} on {h}: {r.status}: {r.reason or r.status}")
            tail = r.tail.splitlines()[-tail_lines:]
            out.extend(f"    {line}" for line in tail)
    return "\n".join(out) + ("\n" if out else "")


def skipped_note(outcome: RunOutcome) -> str:
    """`skipped: check, teardown (step 'build' failed on node2)`: the steps that
    did not run, with why, one line per distinct reason ("" when none)."""
    by_reason: dict[str, list[str]] = {}
    for s in outcome.steps:
        reasons = {str(r.reason) for r in s.results.values() if r.status == "skipped" and r.reason}
        for reason in sorted(r or "not run" for r in reasons):
            by_reason.setdefault(reason, []).append(s.name)
    return "".join(f"skipped: {', '.join(names)} ({why})\n" for why, names in by_reason.items())


def verdict(outcome: RunOutcome) -> str:
    """`test_demo: failed (exit 1) in 3.2s: ...`"""
    word = verdict_word(outcome)
    text = f"{outcome.suite}: {word} (exit {int(outcome.exit_code)}) in {run_seconds(outcome):.1f}s"
    return text + (f": {outcome.error!s}" if outcome.error and outcome.error != word else "")


# ---- html ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One row of the timeline: a phase of the run, placed in percent of the whole."""

    label: str
    status: str
    start: float  # seconds from the run's start
    seconds: float
    left: float  # percent
    width: float  # percent


def timeline(outcome: RunOutcome) -> list[Bar]:
    """up (start to the first step), each step that ran, then down / wrap-up."""
    total = max(run_seconds(outcome), 1e-6)

    def bar(label: str, status: str, start: float, seconds: float) -> Bar:
        start = min(max(start, 0.0), total)
        seconds = min(max(seconds, 0.0), total - start)
        left = 100.0 * start / total
        return Bar(label, status, start, seconds, left, max(100.0 * seconds / total, 0.4))

    # Each step that ran, with its start (never None here).
    ran = [(s, s.started) for s in outcome.steps if s.started is not None]
    bars: list[Bar] = []
    first = ran[0][1] if ran else total
    if first and first > 0:
        # Nothing ran after it: up is where the run stopped (refused, failed).
        up_status = "setup" if ran or outcome.ok else "failed"
        bars.append(bar("up", up_status, 0.0, first))
    bars.extend(bar(s.name, s.status, started, s.duration) for s, started in ran)
    end = max((started + s.duration for s, started in ran), default=first)
    if total - end > 0.05:
        bars.append(
            bar("down" if outcome.lifetime == "per_run" else "wrap-up", "setup", end, total - end)
        )
    return bars


def log_href(step: str, host: str) -> str:
    """The relative link to a host's full log for a step (the RunRecorder's layout)."""
    return f"logs/{quote(step, safe='')}/{quote(host, safe='')}.log"


def cell_id(step: str, host: str) -> str:
    return f"out-{quote(step, safe='')}-{quote(host, safe='')}"


def image_summary(outcome: RunOutcome) -> list[tuple[str, str]]:
    """(image ID, hosts) pairs: one pair when every host ran the same image."""
    by_id: dict[str, list[str]] = {}
    for host, image_id in outcome.image_ids.items():
        by_id.setdefault(image_id, []).append(host)
    return [(i, compress_hostlist(hosts)) for i, hosts in by_id.items()]


def problems(outcome: RunOutcome) -> list[str]:
    """`rccl: failed on gpu[017,033]` per step and status that is not ok (nor skipped)."""
    lines: list[str] = []
    for s in outcome.steps:
        by_status: dict[str, list[str]] = {}
        for h, r in s.results.items():
            if r.status not in ("ok", "skipped"):
                by_status.setdefault(r.status, []).append(h)
        lines.extend(f"{s.name}: {st} on {compress_hostlist(hs)}" for st, hs in by_status.items())
    return lines


def report_context(outcome: RunOutcome, run_dir: Path | None = None) -> dict[str, Any]:
    hosts = run_hosts(outcome)
    counts: dict[str, int] = {}
    for s in outcome.steps:
        for r in s.results.values():
            counts[r.status] = counts.get(r.status, 0) + 1
    return {
        "o": outcome,
        "run_dir": str(run_dir) if run_dir is not None else "",
        "verdict": verdict_word(outcome),
        "exit_code": int(outcome.exit_code),
        "started": utc_stamp(outcome.started),
        "finished": utc_stamp(outcome.finished or outcome.started),
        "seconds": run_seconds(outcome),
        "hosts": hosts,
        "hostlist": compress_hostlist(hosts),
        "hosts_as_rows": len(hosts) > HOSTS_AS_COLUMNS_MAX,
        "counts": counts,
        "timeline": timeline(outcome),
        "problems": problems(outcome),
        "images": image_summary(outcome),
        "tail_lines": REPORT_TAIL_LINES,
    }


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.suites", "templates"),
        autoescape=True,  # host output and names are untrusted text
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(log_href=log_href, cell_id=cell_id)
    env.filters["last_lines"] = lambda text, n: "\n".join(text.splitlines()[-n:])
    return env


def render_report(outcome: RunOutcome, run_dir: Path | None = None) -> str:
    """report.html's text for a run (self-contained)."""
    return _environment().get_template(TEMPLATE).render(**report_context(outcome, run_dir))


def write_report(run_dir: Path, outcome: RunOutcome) -> Path:
    path = run_dir / "report.html"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_report(outcome, run_dir), encoding="utf-8")
    tmp.replace(path)
    return path
