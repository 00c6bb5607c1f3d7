"""Commands that change or show a cluster's containers: plan, up, status, down."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

import yaml

from orchestrator.cli.collector import imports_first
from orchestrator.cli.common import (
    CLI_STYLE,
    CONNECTING,
    chosen_hosts,
    cli_reasons,
    cli_text,
    host_aliases,
    load,
    only_hosts,
    write_json_result,
)
from orchestrator.cli.connect import run_with_cluster
from orchestrator.config.documents import key_lines
from orchestrator.containers.hints import hint_for
from orchestrator.containers.jobleft import describe
from orchestrator.containers.plan.down import down_leftovers
from orchestrator.containers.status import status_exit_code
from orchestrator.errors import ExitCode, restyled
from orchestrator.events import wants_plain
from orchestrator.render import compress_hosts, failure_groups, print_status_lines
from orchestrator.results import HostResult, exit_code_for

if TYPE_CHECKING:
    from orchestrator.api import Cluster
    from orchestrator.config import ClusterConfig
    from orchestrator.containers.outcome import UpReport
    from orchestrator.containers.plan.model import Plan


@imports_first(*CONNECTING)
def cmd_plan(args: argparse.Namespace) -> int:
    args.narrow_hosts = False  # decided over every host, shown for the chosen ones
    plan = run_with_cluster(
        args,
        lambda c: c.plan(
            force=args.force,
            reprovision=args.reprovision,
            adopt=args.adopt,
            only=only_hosts(c.config, args),
            heal=args.heal,
        ),
    )
    reasons = cli_reasons(plan.refusals)
    if args.json:
        write_json_result(
            args,
            ok=not plan.refused,
            exit_code=plan.exit_code,
            error="refused: " + "; ".join(reasons) if plan.refused else None,
            lifetime=plan.lifetime,
            refused=reasons,
            warnings=plan.warnings,
            hosts={h: {"action": a.kind, "reason": a.reason} for h, a in plan.actions.items()},
            spread=plan.spread.to_dict() if plan.spread is not None else None,
        )
        return plan.exit_code
    width = max((len(h) for h in plan.actions), default=4)
    sys.stdout.write(f"lifetime: {plan.lifetime}\n")
    for host, action in plan.actions.items():
        extras = [
            x
            for x, on in (
                ("adopt", action.adopt),
                ("provision", action.provision),
                ("sshd", action.start_sshd),
            )
            if on
        ]
        more = f" (+{', '.join(extras)})" if extras else ""
        sys.stdout.write(f"{host:<{width}}  {action.kind:<10} {cli_text(action.reason)}{more}\n")
    if plan.spread is not None and (plan.spread.peers or plan.spread.registry_fetches):
        sys.stdout.write("".join(f"{line}\n" for line in plan.spread.lines()))
    for w in plan.warnings:
        sys.stderr.write(f"warning: {w}\n")
    if plan.refused:
        sys.stderr.write("refused:\n")
        for r in reasons:
            sys.stderr.write(f"  - {r}\n")
    return plan.exit_code


@imports_first(*CONNECTING)
def cmd_up(args: argparse.Namespace) -> int:
    # A refusal (PolicyRefused) is reported by cli.main, like every CvsError;
    # a host that did not end ready is in the report (check=False), rendered below.
    async def up(cluster: Cluster) -> tuple[ClusterConfig, UpReport]:
        report = await cluster.up(
            force=args.force,
            reprovision=args.reprovision,
            check=False,
            adopt=args.adopt,
            wait=not args.no_wait,
            only=only_hosts(cluster.config, args),
            heal=args.heal,
        )
        return cluster.config, report

    # --hosts: decided over every host (the same rules as a plain `up`),
    # acted on the chosen ones (containers/subset.py).
    args.narrow_hosts = False

    config, report = run_with_cluster(args, up)
    if args.json:
        write_json_result(args, **report.to_dict())
        return report.exit_code
    # Each host as it ended: a host whose start a rollback undid says so
    # (never `ok` for a container that no longer exists); failures fold by error.
    lines = {host: cli_text(o.summary) for host, o in report.outcomes.items() if o.ok}
    # The one-line summary, then the error's output tail: folded and shown by
    # the first line, while the tail is what names a cluster-file setting.
    failed = {
        host: "\n".join([cli_text(o.summary), *cli_text(o.error or "").splitlines()[1:]])
        for host, o in report.outcomes.items()
        if not o.ok
    }
    _write_host_lines(lines)
    _write_failures(failed, config)
    sys.stdout.write(f"up: {len(report.ready)}/{len(report.outcomes)} hosts ready\n")
    return report.exit_code


def _write_failures(failed: dict[str, str], config: Any) -> None:
    """One line per distinct failure with its hostlist (`errortext.fold_errors`:
    names, addresses, container IDs and docker's usage hints set aside); under
    it, when a cluster-file setting caused it, the key, its line and the fix
    (`containers.hints`). The full text is in `--json` and the run's logs."""
    if not failed:
        return
    hints = _hinter(config)
    for hosts, text in failure_groups(failed, host_aliases(config)):
        where = hosts[0] if len(hosts) == 1 else f"{compress_hosts(hosts)} ({len(hosts)})"
        sys.stdout.write(f"{where}: {text}\n")
        hint = hints(failed[hosts[0]])
        if hint:
            sys.stdout.write(f"  fix: {hint}\n")


def _hinter(config: Any) -> Any:
    """error text -> `containers.hints` line (or None) for `config`'s container
    block, with the lines its keys were written on (read once)."""
    source = getattr(config, "source_file", None)
    lines: dict[str, int] = {}
    if source:
        try:
            with open(source, encoding="utf-8") as f:
                lines = key_lines(f.read(), source)
        except (OSError, UnicodeDecodeError):
            lines = {}
    shown = source
    if source and not os.path.relpath(source).startswith(".."):
        shown = os.path.relpath(source)  # under the current directory: the short form

    def hint(error: str) -> str | None:
        found = hint_for(error, getattr(config, "container", None), lines)
        return found.text(shown) if found else None

    return hint


# Above this many hosts, hosts with the identical line are folded into one
# (`node[1-998] (998): attach ok (...)`), like failures and `--group`.
FOLD_ABOVE = 20


def _write_host_lines(lines: dict[str, str]) -> None:
    """Each host's result: the command's output, stdout (docs/cli-output.md)."""
    if len(lines) <= FOLD_ABOVE:
        for host, text in lines.items():
            sys.stdout.write(f"{host}: {text}\n")
        return
    for hosts, text in failure_groups(lines):
        sys.stdout.write(f"{compress_hosts(hosts)} ({len(hosts)}): {text}\n")


@imports_first(*CONNECTING)
def cmd_down(args: argparse.Namespace) -> int:
    async def down(cluster: Any) -> tuple[Any, Plan, dict[str, HostResult], list[Any]]:
        # A refusal (PolicyRefused: a busy lock under --no-wait) is reported by cli.main.
        plan, results = await cluster.down(force=args.force, wait=not args.no_wait)
        # Outside a job: the containers of this cluster's jobs that are over, too.
        jobs = await cluster.job_containers(remove=True)
        return cluster.config.container, plan, results, jobs

    args.job_over_ok = True  # hosts from a job that is over: remove what it left
    outside = _outside_selection(args)
    container, plan, results, jobs = run_with_cluster(args, down)
    code = exit_code_for(list(results.values())) if results else ExitCode.OK
    if plan.unknown_hosts:
        code = max(code, ExitCode.UNREACHABLE)
    left = down_leftovers(
        container,
        plan,
        {h: (r.ok, cli_text(r.error or r.status)) for h, r in results.items()},
        force=args.force,
    )
    left = restyled(left, CLI_STYLE)
    job_lines = [(v.container.host, describe(v), v.remove) for v in jobs]
    for job_host, said, removed_it in job_lines:
        if not removed_it:  # never "nothing left" while one of this cluster's runs
            left[job_host] = f"{left[job_host]}; {said}" if job_host in left else said
    if any(not r and "removing it failed" in t for _, t, r in job_lines):
        code = max(code, ExitCode.FAILED)
    if args.json:
        write_json_result(
            args,
            ok=code == 0,
            exit_code=code,
            warnings=plan.warnings,
            hosts={h: {"action": a.kind, "reason": a.reason} for h, a in plan.actions.items()},
            left=left,
            not_looked_at=outside,
            job_containers=[_job_row(v) for v in jobs],
        )
        return code
    # The plan's warnings were said as it was made (the lifecycle's events): once.
    lines: dict[str, str] = {}
    for host, action in plan.actions.items():
        r = results.get(host)
        if r is None and host in left:
            continue  # said once, below, with what is left there
        done = "" if r is None else (" ok" if r.ok else f" FAILED: {cli_text(r.error or '')}")
        lines[host] = f"{cli_text(action.reason)}{done}"
    _write_host_lines(lines)
    for job_host, said, removed_it in job_lines:
        if removed_it:
            sys.stdout.write(f"{job_host}: job container {said}\n")
    removed = [h for h, r in results.items() if r.ok]
    where = " host(s)" if not outside else f" of the {len(plan.actions)} chosen host(s)"
    if left:
        tail = f"left on {len(left)}:\n"
    elif outside:
        tail = "nothing left on them\n"
    else:
        tail = "nothing left anywhere\n"
    sys.stdout.write(f"down: removed on {len(removed)}{where}; {tail}")
    for host, text in left.items():
        sys.stdout.write(f"  {host}: {text}\n")
    if outside:
        sys.stdout.write(
            f"  not looked at (outside --hosts): {compress_hosts(outside)} "
            "(`cvs status` shows what runs there)\n"
        )
    return code


def _job_row(v: Any) -> dict[str, Any]:
    """One container of a Slurm job (containers/jobleft.Verdict) for --json."""
    c = v.container
    return {"host": c.host, "name": c.name, "state": c.state, "job": c.job,
            "lifetime": c.lifetime, "removed_or_over": v.remove, "why": v.why}  # fmt: skip


def _outside_selection(args: argparse.Namespace) -> list[str]:
    """The cluster's hosts that --hosts/-x leave out (none without either)."""
    if not (getattr(args, "hosts", None) or getattr(args, "exclude", None)):
        return []
    narrow, args.narrow_hosts = getattr(args, "narrow_hosts", False), False
    try:
        full = load(args)
    finally:
        args.narrow_hosts = narrow
    chosen = set(chosen_hosts(full, args))
    return [h.name for h in full.hosts if h.name not in chosen]


@imports_first(*CONNECTING)
def cmd_status(args: argparse.Namespace) -> int:
    # --json is JSON lines on stdout whatever -o says: its one result line is
    # -o json's document (docs/cli-output.md).
    output = "json" if args.json else getattr(args, "output", None) or "table"

    async def both(cluster: Any) -> tuple[Any, list[Any]]:
        # Outside a job, this cluster's containers that jobs started, too.
        return await cluster.status(), await cluster.job_containers()

    args.job_over_ok = True  # hosts from a job that is over: show what it left
    rows, jobs = run_with_cluster(args, both, connect_failures=False)
    code = status_exit_code(rows)
    job_rows = [_job_row(v) for v in jobs]
    if output in ("json", "yaml"):
        # Keyed by host, like every other subcommand's `hosts`.
        hosts = {r.host: r.to_dict() for r in rows}
        extra: dict[str, Any] = {"job_containers": job_rows} if job_rows else {}
        if output == "json":
            write_json_result(args, ok=code == 0, exit_code=code, hosts=hosts, **extra)
        else:
            doc = {"command": "status", "ok": code == 0, "exit_code": int(code), "error": None}
            sys.stdout.write(yaml.safe_dump({**doc, "hosts": hosts, **extra}, sort_keys=False))
        return code
    # --color always (FORCE_COLOR) keeps the coloured table through a pipe: `| less -R`.
    # Each host's reason is printed with the table (`HOST: reason`), once.
    forced = bool(os.environ.get("FORCE_COLOR")) and not os.environ.get("NO_COLOR")
    if wants_plain(sys.stdout) and not forced:
        print_status_lines(rows, wide=output == "wide", style=CLI_STYLE)
    else:
        # rich only on a terminal: piped output never loads it (tests/test_startup.py).
        from orchestrator.render.live import print_status_table

        print_status_table(rows, wide=output == "wide", plain=False, style=CLI_STYLE)
    if jobs:
        sys.stdout.write("containers of Slurm jobs (`cvs down` removes those whose job is over):\n")
        for v in jobs:
            sys.stdout.write(f"  {v.container.host}: {describe(v)}\n")
    return code
