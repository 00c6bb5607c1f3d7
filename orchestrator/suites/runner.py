"""Running a suite: up per lifetime, the steps in order, down per lifetime.

    outcome = await run_suite(suite, cluster_config, recorder=rec, sink=sink)

`per_run` containers are removed at the end whatever happened: a failed
step, an exception, or Ctrl-C (the down runs in a shielded cancel scope).
`persistent` containers are left running; `no_launch` ones are only checked.

The decisions (which hosts a step runs on, whether a host's result meets the
step's `expect`, the MPI environment) are pure functions, tested without a
cluster; `run_suite` is the IO around them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypedDict

import anyio

from orchestrator.api import Cluster, HostSelectionError, select_hosts
from orchestrator.config import ClusterConfig, ConfigError
from orchestrator.config.documents import key_lines
from orchestrator.config.hostlist import compress_hostlist
from orchestrator.containers.copy import CopyError, Payload
from orchestrator.containers.exec import launches_mpi
from orchestrator.containers.hints import hint_for
from orchestrator.containers.mpi import MPIHosts, host_slots, parse_hostfile
from orchestrator.errors import Call, ExitCode, Phrase, PolicyRefused, Text
from orchestrator.errortext import fold_errors
from orchestrator.events import EventSink, HostStep, Message
from orchestrator.results import HostResult
from orchestrator.suites.model import Step, Suite
from orchestrator.suites.records import (
    TAIL_LINES,
    RunOutcome,
    RunRecorder,
    StepHostOutcome,
    StepHostStatus,
    StepOutcome,
    plan_rows,
)
from orchestrator.suites.report import write_report

# Removing per_run containers must finish even after Ctrl-C, but not hang forever.
DOWN_TIMEOUT = 300.0


# ---- pure decisions -------------------------------------------------------------


def step_hosts(step: Step, cluster: ClusterConfig) -> list[str]:
    """The hosts a step runs on, in cluster order. An mpi step runs once, on the head."""
    if step.mpi or step.hosts == "head":
        return [cluster.head_host.name]
    return select_hosts(cluster, step.hosts)


def resolve_step_hosts(suite: Suite, cluster: ClusterConfig) -> dict[str, list[str]]:
    """Every step's hosts (and a copy step's source), checked before anything starts:
    a typo is exit 2, not a half run."""
    out: dict[str, list[str]] = {}
    for index, step in enumerate(suite.steps):
        try:
            out[step.name] = step_hosts(step, cluster)
        except HostSelectionError as exc:
            where = suite.source or suite.name
            raise ConfigError(
                f"{where}: steps[{index}].hosts: {step.hosts!r} matches no host of cluster "
                f"{cluster.name!r} (step {step.name!r}): {exc}"
            ) from None
        if step.copy_ is not None:
            base_dir = Path(suite.source).parent if suite.source else Path.cwd()
            src = copy_source(step, base_dir)
            if not src.exists():
                where = suite.source or suite.name
                raise ConfigError(
                    f"{where}: steps[{index}].copy.src: {src} does not exist (step {step.name!r})"
                )
    return out


def mpi_env(cluster: ClusterConfig, found: MPIHosts | None = None) -> dict[str, str]:
    """What an mpi step's command sees: hostfile path, `-H` style host list,
    rank count; from the hostfile read in the head's container (`found`,
    which has the slots of GPU-sized hosts), else from the config."""
    if found is None or not found.slots:
        hostfile = cluster.container.mpi.hostfile if cluster.container is not None else ""
        slots = tuple(host_slots(cluster).items())
        found = MPIHosts(hostfile, slots)
    return found.env()


def _clip(text: Text, limit: int = 80) -> Text:
    """One line of at most `limit` characters (a Phrase, short by its making, as it is)."""
    if not isinstance(text, str):
        return text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _JudgedFields(TypedDict):
    """What every judged StepHostOutcome takes from the host's result."""

    host: str
    exit_code: int | None
    duration: float
    tail: str


def judge(step: Step, result: HostResult, tail_lines: int = TAIL_LINES) -> StepHostOutcome:
    """Whether one host's result meets the step's `expect`; the reason in one line if not."""
    expect = step.expect
    base: _JudgedFields = {
        "host": result.host,
        "exit_code": result.exit_code,
        "duration": result.duration,
        "tail": result.tail(tail_lines),
    }
    if result.status == "timeout":
        limit = f" after {step.timeout:g}s" if step.timeout is not None else ""
        return StepHostOutcome(status="timeout", reason=f"timed out{limit}", **base)
    if not result.reached:
        return StepHostOutcome(status=result.status, reason=result.error or result.status, **base)
    if result.exit_code is None:
        # Ran, but no exit status came back (signal, dropped channel).
        return StepHostOutcome(status="failed", reason=result.error or "no exit status", **base)
    if result.exit_code != expect.exit_code:
        reason = f"exit {result.exit_code}, expected {expect.exit_code}"
        error: Text = result.error or ""
        # The cause read on the host (containers/causes.py), not the code twice;
        # an error that is only the code (the transport's) adds nothing.
        said: Text = reason
        if result.cause is not None:
            said = Phrase(reason, ": ", _clip(result.cause, 240))
        elif error and str(error) != f"exit code {result.exit_code}":
            said = Phrase(reason, ": ", _clip(error))
        return StepHostOutcome(status="failed", reason=said, **base)
    wanted = expect.stdout_re()
    if wanted is not None and not wanted.search(result.stdout):
        reason = f"stdout did not match {expect.stdout!r}"
        return StepHostOutcome(status="failed", reason=reason, **base)
    unwanted = expect.not_stdout_re()
    if unwanted is not None:
        found = unwanted.search(result.stdout)
        if found:
            reason = f"stdout matched {expect.not_stdout!r}: {_clip(found.group(0))!r}"
            return StepHostOutcome(status="failed", reason=reason, **base)
    return StepHostOutcome(status="ok", **base)


def step_detail(judged: StepHostOutcome) -> str:
    """A judged host's `HostStep` detail: the reason, after how it ended when
    that is not the event's own `failed` (`timeout: timed out after 5s`), so
    no reader strips the status word off again."""
    if judged.ok:
        return ""
    reason = str(judged.reason or judged.status)
    return reason if judged.status == "failed" else f"{judged.status}: {reason}"


def skipped_step(
    step: Step, hosts: list[str], reason: Text, status: StepHostStatus = "skipped"
) -> StepOutcome:
    """A step that did not run (or did not finish) on its hosts, with why."""
    return StepOutcome(
        name=step.name,
        hosts=hosts,
        on=step.on,
        mpi=step.mpi,
        continue_on_failure=step.continue_on_failure,
        results={h: StepHostOutcome(host=h, status=status, reason=reason) for h in hosts},
    )


def up_failure(report: Any, cluster: ClusterConfig | None = None) -> tuple[ExitCode, Text] | None:
    """(exit code, one line) when `up` left some host not ready, else None: the
    largest group of hosts with the same error (`errortext.fold_errors`), and
    when a cluster-file setting caused it, the setting, its line and the fix
    (`containers.hints`)."""
    if getattr(report, "ok", True):
        return None
    failed: dict[str, Text] = {
        h: o.error or "failed" for h, o in report.outcomes.items() if not o.ok
    }
    # Folded by the API's words; the first host's own error (a Phrase stays one) shown.
    groups = fold_errors({h: str(e) for h, e in failed.items()})
    hosts, text = groups[0]
    first = failed[hosts[0]]
    more = (
        Phrase(f" (and {len(groups) - 1} other error(s): ", Call("up"), " shows them)")
        if len(groups) > 1
        else ""
    )
    # The error's tail (docker's own words) is kept, up to a readable length;
    # as the host said it (a Phrase stays one) when folding changed nothing.
    shown: Text = _clip(text, 400)
    if shown == str(first):
        shown = first
    line = Phrase(f"up failed on {compress_hostlist(hosts)}: ", shown, more)
    hint = _setting_hint(str(first), cluster)
    if hint:
        line = Phrase(line, f"; fix: {hint}")
    return ExitCode(report.exit_code) or ExitCode.FAILED, line


def _setting_hint(error: str, cluster: ClusterConfig | None) -> str | None:
    if cluster is None or cluster.container is None:
        return None
    lines: dict[str, int] = {}
    source = cluster.source_file
    if source:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = key_lines(Path(source).read_text(encoding="utf-8"), source)
    found = hint_for(error, cluster.container, lines)
    return found.text(source) if found else None


def _is_interrupt(exc: BaseException) -> bool:
    return isinstance(exc, KeyboardInterrupt | anyio.get_cancelled_exc_class())


# ---- IO -----------------------------------------------------------------------------


def new_outcome(suite: Suite, cluster: ClusterConfig, cluster_file: str) -> RunOutcome:
    lifetime = cluster.container.lifetime if cluster.container is not None else None
    return RunOutcome(
        suite=suite.name,
        suite_file=suite.source or "",
        description=suite.description,
        cluster=cluster.name,
        cluster_file=cluster_file,
        lifetime=lifetime,
        started=datetime.now(UTC),
        image=cluster.container.image if cluster.container is not None else None,
        slurm_job=cluster.slurm.job_id if cluster.slurm is not None else None,
    )


def copy_source(step: Step, base_dir: Path) -> Path:
    """A copy step's local source: `~` expanded, relative to the suite file's directory."""
    src = Path(os.path.expanduser(step.copy_.src))  # type: ignore[union-attr]
    return src if src.is_absolute() else base_dir / src


async def _copy(
    cluster: Cluster, step: Step, hosts: list[str], base_dir: Path
) -> dict[str, HostResult]:
    try:
        payload = Payload.from_path(copy_source(step, base_dir))
    except CopyError as exc:
        return {h: HostResult(h, "failed", error=f"copy: {exc}", stderr=str(exc)) for h in hosts}
    try:
        return await cluster.copy_to(
            payload,
            step.copy_.dest,  # type: ignore[union-attr]
            hosts=hosts,
            host_os=step.on == "host",
            timeout=step.timeout,
        )
    finally:
        payload.close()


async def _mpi_ready(
    cluster: Cluster, hosts: list[str]
) -> tuple[dict[str, HostResult] | None, MPIHosts | None]:
    """Before an mpi step: `mpirun` in the head's image and every peer's
    sshd answering (Cluster.mpi_check); the step fails, naming what is
    wrong, instead of an `mpirun` that fails or hangs on a peer."""
    check, problems = await cluster.mpi_check(need_mpirun=True)
    found = None
    if check is not None and cluster.config.container is not None:
        found = parse_hostfile(cluster.config.container.mpi.hostfile, "\n".join(check.hostfile))
    if not problems:
        return None, found
    text = "; ".join(problems)
    return {
        h: HostResult(h, "failed", stderr="\n".join(problems), error=text) for h in hosts
    }, found


async def _run_step(
    cluster: Cluster,
    step: Step,
    hosts: list[str],
    recorder: RunRecorder | None,
    sink: EventSink,
    base_dir: Path = Path("."),
) -> StepOutcome:
    env = dict(step.env)
    if recorder is not None:
        recorder.begin_step(step.name, hosts)
    for h in hosts:
        sink.emit(HostStep(host=h, step=step.name, status="started"))
    started = time.monotonic()
    refused: dict[str, HostResult] | None = None
    if step.mpi:
        refused, found = await _mpi_ready(cluster, hosts)
        env = {**mpi_env(cluster.config, found), **env}
    if refused is not None:
        results = refused
    elif step.copy_ is not None:
        results = await _copy(cluster, step, hosts, base_dir)
    else:
        results = await cluster.exec(
            step.run,  # type: ignore[arg-type]  # a step has run or copy
            hosts=hosts,
            timeout=step.timeout,
            host_os=step.on == "host",
            env=env or None,
            user=step.user,
            workdir=step.workdir,
        )
        if step.mpi and not launches_mpi(step.run or ""):
            # Which peer's container ended, when the job failed (`exec` looks
            # by itself when the command names mpirun).
            results = await cluster.name_ended_peers(results)
    outcome = StepOutcome(
        name=step.name,
        hosts=hosts,
        on=step.on,
        mpi=step.mpi,
        continue_on_failure=step.continue_on_failure,
        duration=time.monotonic() - started,
    )
    for h in hosts:
        result = results.get(h) or HostResult(host=h, status="failed", error="no result")
        if recorder is not None:
            result = recorder.end_log(step.name, result)
        judged = judge(step, result)
        outcome.results[h] = judged
        status: Literal["ok", "failed"] = "ok" if judged.ok else "failed"
        sink.emit(HostStep(host=h, step=step.name, status=status, detail=step_detail(judged)))
    return outcome


async def _steps(
    cluster: Cluster,
    suite: Suite,
    hosts: dict[str, list[str]],
    outcome: RunOutcome,
    recorder: RunRecorder | None,
    sink: EventSink,
) -> None:
    stop_reason: str | None = None
    for index, step in enumerate(suite.steps):
        if stop_reason is not None:
            outcome.steps[index] = skipped_step(step, hosts[step.name], stop_reason)
            continue
        offset = (datetime.now(UTC) - outcome.started).total_seconds()
        try:
            base_dir = Path(suite.source).parent if suite.source else Path.cwd()
            done = await _run_step(cluster, step, hosts[step.name], recorder, sink, base_dir)
            done.started = offset
        except BaseException as exc:
            if _is_interrupt(exc):
                stopped = skipped_step(step, hosts[step.name], "interrupted", "interrupted")
            else:
                reason = f"{type(exc).__name__}: {exc}"
                stopped = skipped_step(step, hosts[step.name], _clip(reason), "failed")
            outcome.steps[index] = stopped
            raise
        outcome.steps[index] = done
        if done.status == "failed" and not step.continue_on_failure:
            failed_on = [h for h, r in done.results.items() if not r.ok]
            stop_reason = f"step {step.name!r} failed on {compress_hostlist(failed_on)}"
            later = [s.name for s in suite.steps[index + 1 :]]
            if later:
                # Said now, not only in the table at the end: why nothing more runs.
                sink.emit(Message(level="info", text=f"skipping {', '.join(later)}: {stop_reason}"))


async def run_suite(
    suite: Suite,
    cluster: ClusterConfig,
    *,
    sink: EventSink,
    recorder: RunRecorder | None = None,
    cluster_file: str = "",
    outcome: RunOutcome | None = None,
    force: bool = False,
    wait: bool = True,
) -> RunOutcome:
    """Run `suite` on `cluster`; always returns (or re-raises cancellation) with the
    outcome recorded. Pass `outcome` to keep a handle on it if the run is interrupted."""
    hosts = resolve_step_hosts(suite, cluster)
    outcome = outcome or new_outcome(suite, cluster, cluster_file)
    outcome.steps = [skipped_step(s, hosts[s.name], "not run") for s in suite.steps]
    # A run record that cannot be written stops the run (remote commands are
    # killed by the cancellation), never the tear-down below.
    stop = anyio.CancelScope()
    if recorder is not None:
        recorder.on_failure = stop.cancel
    try:
        async with Cluster.open(cluster, sink=sink) as fleet:
            fleet.purpose = f"run {suite.name}"
            await _run_on_fleet(
                fleet, suite, cluster, hosts, outcome, recorder, sink, stop, force=force, wait=wait
            )
    except BaseException as exc:
        if _is_interrupt(exc):
            outcome.interrupted = True
            outcome.error = outcome.error or "interrupted"
        elif outcome.error is None:
            outcome.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        outcome.finished = datetime.now(UTC)
        if recorder is not None:
            recorder.on_failure = None
            recorder.finish(outcome, report=write_report)
    return outcome


async def _run_on_fleet(
    fleet: Cluster,
    suite: Suite,
    cluster: ClusterConfig,
    hosts: dict[str, list[str]],
    outcome: RunOutcome,
    recorder: RunRecorder | None,
    sink: EventSink,
    stop: anyio.CancelScope,
    *,
    force: bool,
    wait: bool,
) -> None:
    """`up` (with a container block), the steps, and per_run's tear-down of
    what `up` started, whatever happened in between."""
    managed = cluster.container is not None
    per_run = managed and cluster.container.lifetime == "per_run"  # type: ignore[union-attr]
    up_entered = False
    try:
        with stop:
            if managed:
                up_entered = True
                if not await _up(fleet, suite, cluster, hosts, outcome, force=force, wait=wait):
                    return
            await _steps(fleet, suite, hosts, outcome, recorder, sink)
        if recorder is not None and recorder.failure is not None:
            outcome.error = str(recorder.failure)
            _mark_stopped(outcome, "stopped: run record not writable")
    except PolicyRefused as exc:
        up_entered = False  # refused: nothing was changed, nothing to undo
        outcome.refused = True
        outcome.error = f"refused: {exc}"
        outcome.steps = [skipped_step(s, hosts[s.name], "refused") for s in suite.steps]
    finally:
        if per_run and up_entered:
            in_flight = sys.exc_info()[1]
            interrupted = in_flight is not None and _is_interrupt(in_flight)
            await _down(fleet, outcome, sink, interrupted=interrupted)


async def _up(
    fleet: Cluster,
    suite: Suite,
    cluster: ClusterConfig,
    hosts: dict[str, list[str]],
    outcome: RunOutcome,
    *,
    force: bool,
    wait: bool,
) -> bool:
    """`up` for the run: whether every host is ready (else the steps are
    skipped, the outcome says why)."""
    # `up` leaves every host locked shared for the steps: other runs share
    # the containers, nothing replaces them meanwhile.
    report = await fleet.up(force=force, check=False, wait=wait)
    outcome.plan = plan_rows(report)
    outcome.warnings.extend(getattr(report.plan, "warnings", []))
    failure = up_failure(report, cluster)
    if failure is not None:
        outcome.up_exit_code, outcome.error = failure
        outcome.steps = [skipped_step(s, hosts[s.name], "up failed") for s in suite.steps]
        return False
    outcome.image_ids = await image_ids(fleet)
    return True


async def image_ids(fleet: Cluster) -> dict[str, str]:
    """host -> the image ID its container runs (for the report); hosts not read are left out."""
    return await fleet.container_image_ids()


def _mark_stopped(outcome: RunOutcome, reason: str) -> None:
    """Hosts cut short or never started by a stop that was not the user's Ctrl-C."""
    for step in outcome.steps:
        for host, r in step.results.items():
            if r.status == "interrupted":
                step.results[host] = replace(r, status="failed", reason=reason)
            elif r.status == "skipped" and r.reason == "not run":
                step.results[host] = replace(r, reason=reason)


async def _down(
    fleet: Cluster, outcome: RunOutcome, sink: EventSink, *, interrupted: bool = False
) -> None:
    # Shielded: on Ctrl-C the run is being cancelled, and this is the part that must happen.
    with anyio.move_on_after(DOWN_TIMEOUT, shield=True) as scope:
        try:
            # Only what this run started (a run that waited for ours may have
            # replaced it by the time we get the exclusive lock).
            _, removed = await fleet.down(own_only=True)
        except Exception as exc:
            failed = f"down failed: {type(exc).__name__}: {exc}"
            outcome.warnings.append(failed)
            sink.emit(Message(level="error", text=failed))
            return
        for host, r in removed.items():
            if not r.ok:
                reason = r.error or r.status
                outcome.warnings.append(f"could not remove the container on {host}: {reason}")
                # The event carries the host: the sinks prefix it once.
                sink.emit(
                    Message(
                        level="error", text=f"could not remove the container: {reason}", host=host
                    )
                )
        gone = [h for h, r in removed.items() if r.ok]
        if gone:
            # Say what the clean-up did, above all after Ctrl-C (the run's last words
            # are otherwise "interrupted"): the per_run containers are gone.
            why = " (interrupted)" if interrupted or outcome.interrupted else ""
            sink.emit(
                Message(
                    level="info",
                    text=f"removed this run's per_run containers on {compress_hostlist(gone)}{why}",
                )
            )
    if scope.cancelled_caught:
        text: Text = Phrase(
            f"down did not finish within {DOWN_TIMEOUT:g}s; run ", Call("down"), " to clean up"
        )
        outcome.warnings.append(text)
        sink.emit(Message(level="error", text=text))
