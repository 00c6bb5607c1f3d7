"""Run records: what a suite run leaves behind in its run directory.

    runs/20250101T120000Z-test_demo/
      events.jsonl            every event but output lines, one JSON object per line
      logs/STEP/HOST.log      that host's stdout and stderr for that step, as it came
      results.json            the outcome (schema: orchestrator/schemas/results.schema.json)
      junit.xml               one testcase per step x host, for CI systems
      report.html             the same for a person: step x host matrix, timeline, tails

The outcome types here are plain data; `results_document` and `junit_xml`
are pure functions of them, so they are tested without a cluster.

The directory is private (0700, files 0600): logs hold whatever commands
print. Output streams into the logs while a step runs; nothing holds it whole.

A record that cannot be written (disk full, directory gone) never raises into
the run: the recorder stops writing, remembers the first failure (`failure`,
one line naming the path) and calls `on_failure`, which the runner uses to stop
the run (remote commands killed, tear-down per the lifetime as usual).
"""

from __future__ import annotations

import contextlib
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal, TypedDict

from orchestrator.errors import API_STYLE, ExitCode, Param, Phrase, Style, Text, restyled, say
from orchestrator.errors import RecordError as RecordError
from orchestrator.errors import RunDirError as RunDirError
from orchestrator.events import Event, OutputLine, in_words
from orchestrator.results import CONNECTION_STATUSES, HostResult

RESULTS_SCHEMA_VERSION = 1
TAIL_LINES = 20

StepHostStatus = Literal[
    "ok", "failed", "timeout", "unreachable", "auth", "host_key", "skipped", "interrupted"
]
StepStatus = Literal["ok", "failed", "skipped"]


def plan_rows(report: Any) -> dict[str, dict[str, str]]:
    """host -> {action, reason} from an `UpReport` (its plan's per-host actions),
    as a run record keeps them."""
    actions: Any = getattr(getattr(report, "plan", None), "actions", {}) or {}
    # The reason as it is (an errors.Phrase stays one: the record's style renders it).
    return {h: {"action": str(a.kind), "reason": a.reason} for h, a in actions.items()}


@dataclass(frozen=True)
class StepHostOutcome:
    """One step on one host, judged against the step's `expect`."""

    host: str
    status: StepHostStatus
    exit_code: int | None = None
    duration: float = 0.0
    tail: str = ""
    # Why it is not ok, in one line ("exit 1, expected 0", "stdout did not match ...").
    reason: Text | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def reached(self) -> bool:
        return self.status not in CONNECTION_STATUSES


@dataclass
class StepOutcome:
    name: str
    hosts: list[str]
    on: str = "container"
    mpi: bool = False
    continue_on_failure: bool = False
    results: dict[str, StepHostOutcome] = field(default_factory=dict)
    duration: float = 0.0
    # Seconds from the run's start to this step's (None: it did not run). The timeline.
    started: float | None = None

    @property
    def status(self) -> StepStatus:
        if not self.results or all(r.status == "skipped" for r in self.results.values()):
            return "skipped"
        return "ok" if all(r.ok for r in self.results.values()) else "failed"


@dataclass
class RunOutcome:
    suite: str
    suite_file: str
    description: str
    cluster: str
    cluster_file: str
    lifetime: str | None
    started: datetime
    finished: datetime | None = None
    # host -> {"action": ..., "reason": ...} from the up report's plan.
    plan: dict[str, dict[str, str]] = field(default_factory=dict)
    steps: list[StepOutcome] = field(default_factory=list)
    # Set when the run stopped before or between steps: refused, up failed, interrupted.
    error: Text | None = None
    interrupted: bool = False
    refused: bool = False
    # `up` left hosts not ready: 3 (unreachable) or 1.
    up_exit_code: int | None = None
    # Stale images, failed removals, ...: recorded, but they do not fail the run.
    warnings: list[Text] = field(default_factory=list)
    # container.image as asked for, and host -> image ID its container ran (read after up).
    image: str | None = None
    image_ids: dict[str, str] = field(default_factory=dict)
    # The Slurm job the hosts came from (hosts: {from: slurm}).
    slurm_job: str | None = None

    @property
    def exit_code(self) -> ExitCode:
        """docs/design.md: 130 interrupted, 4 refused, 3 unreachable, 1 a step failed, 0 ok."""
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if self.refused:
            return ExitCode.REFUSED
        outcomes = [r for s in self.steps for r in s.results.values()]
        if any(not r.reached for r in outcomes):
            return ExitCode.UNREACHABLE
        if self.up_exit_code:
            return ExitCode(self.up_exit_code)
        if self.error is not None or any(s.status == "failed" for s in self.steps):
            return ExitCode.FAILED
        return ExitCode.OK

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def utc_stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_run_dir(suite: str, now: datetime | None = None, base: Path = Path("runs")) -> Path:
    """`runs/<UTC time YYYYmmddTHHMMSSZ>-<suite>`."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return base / f"{moment.strftime('%Y%m%dT%H%M%SZ')}-{suite}"


# ---- results.json ---------------------------------------------------------------


def _host_doc(r: StepHostOutcome) -> dict[str, Any]:
    return {
        "status": r.status,
        "ok": r.ok,
        "exit_code": r.exit_code,
        "duration": round(r.duration, 3),
        "reason": r.reason,
        "tail": r.tail,
    }


def results_document(outcome: RunOutcome) -> dict[str, Any]:
    """The results.json content (orchestrator/schemas/results.schema.json describes it)."""
    finished = outcome.finished or outcome.started
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "suite": {
            "name": outcome.suite,
            "file": outcome.suite_file,
            "description": outcome.description,
        },
        "cluster": {
            "name": outcome.cluster,
            "file": outcome.cluster_file,
            "lifetime": outcome.lifetime,
            "image": outcome.image,
            "image_ids": dict(outcome.image_ids),
            **({"slurm_job": outcome.slurm_job} if outcome.slurm_job else {}),
        },
        "started": utc_stamp(outcome.started),
        "finished": utc_stamp(finished),
        "duration": round((finished - outcome.started).total_seconds(), 3),
        "plan": {host: dict(entry) for host, entry in outcome.plan.items()},
        "steps": [
            {
                "name": s.name,
                "on": s.on,
                "mpi": s.mpi,
                "continue_on_failure": s.continue_on_failure,
                "status": s.status,
                "duration": round(s.duration, 3),
                "started": None if s.started is None else round(s.started, 3),
                "hosts": {h: _host_doc(r) for h, r in s.results.items()},
            }
            for s in outcome.steps
        ],
        "ok": outcome.ok,
        "exit_code": outcome.exit_code,
        "interrupted": outcome.interrupted,
        "error": outcome.error,
        "warnings": list(outcome.warnings),
    }


def _parse_stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def outcome_from_document(doc: dict[str, Any]) -> RunOutcome:
    """The inverse of `results_document`: a RunOutcome back from results.json.

    KeyError / ValueError / TypeError when the document is not one we wrote.
    """
    steps = [
        StepOutcome(
            name=s["name"],
            hosts=list(s["hosts"]),
            on=s["on"],
            mpi=s["mpi"],
            continue_on_failure=s["continue_on_failure"],
            duration=float(s["duration"]),
            started=s.get("started"),
            results={
                h: StepHostOutcome(
                    host=h,
                    status=r["status"],
                    exit_code=r["exit_code"],
                    duration=float(r["duration"]),
                    tail=r["tail"],
                    reason=r["reason"],
                )
                for h, r in s["hosts"].items()
            },
        )
        for s in doc["steps"]
    ]
    code = int(doc["exit_code"])
    started = _parse_stamp(doc["started"])
    # The stamps are whole seconds; `duration` is the run's exact length: the
    # same number the live summary printed (`report.run_seconds`), not 1.0 s
    # for a run of 0.3 s that crossed a second boundary.
    duration = doc.get("duration")
    finished = (
        started + timedelta(seconds=float(duration))
        if isinstance(duration, int | float)
        else _parse_stamp(doc["finished"])
    )
    return RunOutcome(
        suite=doc["suite"]["name"],
        suite_file=doc["suite"]["file"],
        description=doc["suite"]["description"],
        cluster=doc["cluster"]["name"],
        cluster_file=doc["cluster"]["file"],
        lifetime=doc["cluster"]["lifetime"],
        started=started,
        finished=finished,
        plan={h: dict(e) for h, e in doc["plan"].items()},
        steps=steps,
        error=doc["error"],
        interrupted=bool(doc["interrupted"]),
        refused=code == ExitCode.REFUSED,
        up_exit_code=code if code in (ExitCode.FAILED, ExitCode.UNREACHABLE) else None,
        warnings=list(doc["warnings"]),
        image=doc["cluster"].get("image"),
        image_ids=dict(doc["cluster"].get("image_ids") or {}),
        slurm_job=doc["cluster"].get("slurm_job"),
    )


# ---- junit.xml ------------------------------------------------------------------

# XML 1.0 cannot carry most control characters; command output may contain them.
_XML_BAD = {c: None for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)}


def _xml_text(text: str) -> str:
    return text.translate(_XML_BAD)


class _JUnitCounts(TypedDict):
    """The count attributes of <testsuites> and <testsuite>."""

    tests: str
    failures: str
    errors: str
    skipped: str


def junit_xml(outcome: RunOutcome) -> str:
    """One testcase per step x host: classname `suite.step`, name `host`.

    failed / timeout -> <failure>, unreachable / auth / host_key -> <error>
    (the test never ran), skipped -> <skipped>.
    """
    cases: list[ET.Element] = []
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for step in outcome.steps:
        for host, r in step.results.items():
            case = ET.Element(
                "testcase",
                classname=f"{outcome.suite}.{step.name}",
                name=host,
                time=f"{r.duration:.3f}",
            )
            counts["tests"] += 1
            message = _xml_text(str(r.reason or r.status))
            if r.status in ("failed", "timeout"):
                counts["failures"] += 1
                failure = ET.SubElement(case, "failure", message=message, type=r.status)
                failure.text = _xml_text(r.tail)
            elif r.status == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=message)
            elif not r.ok:
                counts["errors"] += 1
                error = ET.SubElement(case, "error", message=message, type=r.status)
                error.text = _xml_text(r.tail)
            elif r.tail:
                out = ET.SubElement(case, "system-out")
                out.text = _xml_text(r.tail)
            cases.append(case)
    finished = outcome.finished or outcome.started
    attrs: _JUnitCounts = {
        "tests": str(counts["tests"]),
        "failures": str(counts["failures"]),
        "errors": str(counts["errors"]),
        "skipped": str(counts["skipped"]),
    }
    seconds = f"{(finished - outcome.started).total_seconds():.3f}"
    root = ET.Element("testsuites", name=outcome.suite, time=seconds, **attrs)
    suite = ET.SubElement(
        root,
        "testsuite",
        name=outcome.suite,
        timestamp=utc_stamp(outcome.started),
        time=seconds,
        **attrs,
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("cluster", outcome.cluster),
        ("cluster_file", outcome.cluster_file),
        ("lifetime", outcome.lifetime or "none"),
        ("exit_code", str(outcome.exit_code)),
    ):
        ET.SubElement(props, "property", name=key, value=_xml_text(value))
    if outcome.error:
        ET.SubElement(props, "property", name="error", value=_xml_text(str(outcome.error)))
    suite.extend(cases)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# ---- the run directory ------------------------------------------------------------

DIR_MODE = 0o700
FILE_MODE = 0o600


def _open_private(path: Path, mode: str = "w") -> IO[str]:
    """A text file only its owner can read (whatever the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, mode, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _mkdir_private(path: Path, *, exist_ok: bool) -> None:
    path.mkdir(mode=DIR_MODE, exist_ok=exist_ok)
    os.chmod(path, DIR_MODE)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with _open_private(tmp) as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _result_text(result: HostResult, *, note: bool) -> str:
    """A result's output as log text (each part ending in a newline), with the
    `[cvs] status: error` line when `note` and it failed."""
    parts = [result.stdout]
    if result.stderr:
        parts.append(result.stderr)
    if note and result.error and result.status != "ok":
        parts.append(f"[cvs] {result.status}: {result.error!s}\n")
    return "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)


class _RecordSink:
    """The run directory as an event sink: events to events.jsonl, output lines
    to the log of the step running on that host."""

    def __init__(self, recorder: RunRecorder) -> None:
        self.recorder = recorder

    def emit(self, event: Event) -> None:
        if isinstance(event, OutputLine):
            self.recorder._log_line(event)
        else:
            self.recorder._event(event)

    def close(self) -> None:
        self.recorder._flush_events()


class RunRecorder:
    """Creates a run directory and writes into it as the run goes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._events: IO[str] | None = None
        # host -> (step, open log) while a step runs there.
        self._logs: dict[str, tuple[str, IO[str] | None]] = {}
        self.failure: RecordError | None = None
        self.on_failure: Callable[[], None] | None = None
        # Whose words the record's messages are in (errors.Phrase): the API's,
        # or the CLI's for a run the CLI started (it sets its own).
        self.style: Style = API_STYLE

    @classmethod
    def create(cls, run_dir: Path, *, unique: bool = False) -> RunRecorder:
        """Make the run directory (0700); with `unique`, `-2`, `-3`, ... when it already
        exists (two runs of one suite in the same second)."""
        candidate, n = run_dir, 1
        while True:
            try:
                candidate.mkdir(mode=DIR_MODE, parents=True, exist_ok=not unique)
                if not candidate.is_dir():
                    raise FileExistsError(candidate)
                os.chmod(candidate, DIR_MODE)
                break
            except FileExistsError:
                if not unique:
                    # An existing file is never silently swapped for FILE-2.
                    raise RunDirError(
                        Phrase(
                            f"run directory {candidate}: exists and is not a directory; "
                            "give a directory path to ",
                            Param("run_dir"),
                        )
                    ) from None
                n += 1
                candidate = run_dir.with_name(f"{run_dir.name}-{n}")
            except NotADirectoryError:
                raise RunDirError(
                    f"run directory {candidate}: a parent of it is a file, not a directory"
                ) from None
            except OSError as exc:
                raise RunDirError(
                    f"run directory {candidate}: cannot create it: {exc.strerror or exc}"
                ) from None
        try:
            _mkdir_private(candidate / "logs", exist_ok=True)
        except OSError as exc:
            raise RunDirError(
                f"run directory {candidate}: cannot write in it: {exc.strerror or exc}"
            ) from None
        return cls(candidate)

    @property
    def events_path(self) -> Path:
        return self.run_dir / "events.jsonl"

    @property
    def results_path(self) -> Path:
        return self.run_dir / "results.json"

    @property
    def junit_path(self) -> Path:
        return self.run_dir / "junit.xml"

    @property
    def report_path(self) -> Path:
        return self.run_dir / "report.html"

    def log_path(self, step: str, host: str) -> Path:
        return self.run_dir / "logs" / step / f"{host}.log"

    # -- failures ---------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """Turn an OSError into the recorder's failure (the first one wins)."""
        try:
            yield
        except OSError as exc:
            self._fail(path, exc)

    def _fail(self, path: Path, exc: OSError) -> None:
        if self.failure is not None:
            return
        self.failure = RecordError(path, exc)
        self.close()
        if self.on_failure is not None:
            self.on_failure()

    # -- events -----------------------------------------------------------------

    def events_sink(self) -> _RecordSink:
        return _RecordSink(self)

    def _event(self, event: Event) -> None:
        if self.failure is not None:
            return
        with self._writing(self.events_path):
            if self._events is None:
                self._events = _open_private(self.events_path)
            event = in_words(event, self.style)
            self._events.write(json.dumps(event.to_dict(), default=str) + "\n")
            self._events.flush()

    def _flush_events(self) -> None:
        if self._events is not None and self.failure is None:
            with self._writing(self.events_path):
                self._events.flush()

    # -- per-host logs ------------------------------------------------------------

    def begin_step(self, step: str, hosts: list[str]) -> None:
        """Output lines from these hosts go to this step's logs until `end_log`."""
        if self.failure is not None:
            return
        path = self.run_dir / "logs" / step
        with self._writing(path):
            _mkdir_private(path, exist_ok=True)
            for host in hosts:
                self._logs[host] = (step, None)

    def _log_file(self, host: str) -> IO[str] | None:
        entry = self._logs.get(host)
        if entry is None:
            return None
        step, f = entry
        if f is None:
            f = _open_private(self.log_path(step, host))
            self._logs[host] = (step, f)
        return f

    def _log_line(self, event: OutputLine) -> None:
        if self.failure is not None or event.host not in self._logs:
            return
        with self._writing(self.log_path(self._logs[event.host][0], event.host)):
            f = self._log_file(event.host)
            if f is not None:
                f.write(event.line if event.continues else event.line + "\n")

    def end_log(self, step: str, result: HostResult) -> HostResult:
        """Close the host's log for `step` (noting why it failed); the result says where it is."""
        path = self.log_path(step, result.host)
        if self.failure is not None:
            return result
        with self._writing(path):
            entry = self._logs.get(result.host)
            if entry is None or entry[0] != step:
                entry = self._logs[result.host] = (step, None)
            streamed = entry[1] is not None
            f = self._log_file(result.host)
            if f is not None:
                if not streamed:
                    # Work whose output did not stream through the sink (a copy step).
                    f.write(_result_text(result, note=False))
                if result.error and result.status != "ok":
                    f.write(f"[cvs] {result.status}: {say(result.error, self.style)}\n")
                f.close()
            del self._logs[result.host]
            return replace(result, output_file=str(path))
        return result

    def write_log(self, step: str, result: HostResult) -> Path:
        """A host's log written whole from a result (output not streamed through the sink)."""
        path = self.log_path(step, result.host)
        text = _result_text(result, note=True)
        with self._writing(path):
            _mkdir_private(path.parent, exist_ok=True)
            with _open_private(path) as f:
                f.write(text)
        return path

    def finish(self, outcome: RunOutcome, *, report: Callable[[Path, RunOutcome], Path]) -> None:
        """Write report.html (with `report`: suites.report.write_report, given
        by the caller so that records and the report do not import each other),
        results.json and junit.xml (atomically: a reader never sees half a file).

        After a write failure nothing more is attempted: the run already failed
        for it, and the tear-down must not wait on a full disk.
        """
        if self.failure is not None:
            return
        # The report first: if it cannot be written, results.json says so.
        try:
            os.chmod(report(self.run_dir, restyled(outcome, self.style)), FILE_MODE)
        except Exception as exc:
            outcome.warnings.append(f"report.html not written: {type(exc).__name__}: {exc}")
        doc = restyled(results_document(outcome), self.style)
        doc["run_dir"] = str(self.run_dir)
        with self._writing(self.results_path):
            _write_atomic(self.results_path, json.dumps(doc, indent=2) + "\n")
        if self.failure is None:
            with self._writing(self.junit_path):
                _write_atomic(self.junit_path, junit_xml(outcome))

    def close(self) -> None:
        """Close every open log and the event stream; errors closing are moot by now."""
        for _, f in self._logs.values():
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._logs.clear()
        if self._events is not None:
            with contextlib.suppress(OSError):
                self._events.close()
            self._events = None
