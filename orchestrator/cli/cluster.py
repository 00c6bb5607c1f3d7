"""Commands that act on a cluster: validate, exec, plan, up, status, down."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio

from orchestrator.cli.collector import imports_first
from orchestrator.cli.common import (
    CLI_STYLE,
    CONNECTING,
    RawWriter,
    chosen_hosts,
    cli_reasons,
    cli_text,
    cluster_path,
    failure_summary,
    host_aliases,
    load,
    make_sink,
    only_hosts,
    print_json_summary,
    run_with_cluster,
    stdin_to_pass,
    tell_stdout_closed,
    while_stdout_is_read,
    write_json_result,
)
from orchestrator.containers.exec import NOT_RUNNING_EXIT
from orchestrator.errors import ExitCode, UsageError, restyled
from orchestrator.events import wants_plain
from orchestrator.results import HostResult, exit_code_for

if TYPE_CHECKING:
    from orchestrator.api import Cluster
    from orchestrator.config import ClusterConfig
    from orchestrator.containers.outcome import UpReport
    from orchestrator.containers.plan.model import Plan


SLURM_AT_RUN_TIME = (
    "hosts come from the running Slurm job at run time (cvs inside salloc or an sbatch "
    "script); outside a job the rest of the file was checked"
)


def cmd_validate(args: argparse.Namespace) -> int:
    from orchestrator.config import cluster_warnings, cvs_import_notes, normalized_cluster
    from orchestrator.config.loader import RUN_TIME_HOST
    from orchestrator.config.slurm import SlurmOutsideJob
    from orchestrator.limits.resources import cluster_effective_resources

    try:
        cluster = load(args, check_files=not args.no_check_files)
        at_run_time = False
    except SlurmOutsideJob:
        # Outside a job the hosts of `hosts: {from: slurm}` are not known yet:
        # check the rest, and say where the hosts will come from.
        cluster = load(args, check_files=not args.no_check_files, hosts_at_run_time=True)
        at_run_time = True
    # A value that loads but that docker would refuse (cpus 0.001, memory 1Ki)
    # raises ResourceError, a ConfigError: exit 2 naming the key.
    cluster_effective_resources(cluster)
    doc = normalized_cluster(cluster)
    warnings = cluster_warnings(cluster)
    notes = cvs_import_notes(cluster)
    if at_run_time:
        doc["hosts"] = {"from": "slurm"}
        if doc.get("head") == RUN_TIME_HOST["name"]:
            doc.pop("head")
        notes = [*notes, SLURM_AT_RUN_TIME]
    if args.json:
        write_json_result(
            args, ok=True, exit_code=ExitCode.OK, cluster=doc, warnings=warnings, notes=notes
        )
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        for w in warnings:
            sys.stderr.write(f"warning: {w}\n")
        for n in notes:
            sys.stderr.write(f"note: {n}\n")
        count = "hosts from the Slurm job" if at_run_time else f"{len(cluster.hosts)} hosts"
        sys.stderr.write(f"{cluster_path(args)}: ok, {count}\n")
    return ExitCode.OK


@imports_first(*CONNECTING)
def cmd_exec(args: argparse.Namespace) -> int:
    from orchestrator.api import Cluster

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("cvs exec: no command given (usage: cvs exec [options] -- CMD ...)")
    env = _env_args(args.env)
    cluster_cfg = load(args)
    hosts = chosen_hosts(cluster_cfg, args)
    # One argument is taken as shell text (`cvs exec -- 'a | b'`), several as argv.
    remote: str | list[str] = command[0] if len(command) == 1 else command
    sink = make_sink(args, output=not args.group, cluster=cluster_cfg)
    raw = _raw_writer(args, hosts)
    stdin = None if args.no_stdin else stdin_to_pass()

    async def main() -> dict[str, HostResult] | None:
        async with Cluster.open(cluster_cfg, sink=sink) as cluster:
            # Whoever reads our stdout went away (`| head -1`): stop the remote
            # commands (cancellation kills them) instead of running on unread.
            async with while_stdout_is_read(raw or sink):
                return await cluster.exec(
                    remote,
                    hosts=hosts,
                    timeout=args.timeout,
                    host_os=args.host_os,
                    env=env or None,
                    user=args.user,
                    workdir=args.workdir,
                    wait=not args.no_wait,
                    stdin=stdin,
                    raw_output=raw,
                )
            return None

    try:
        results = anyio.run(main)
    finally:
        sink.close()
    if results is None:
        tell_stdout_closed("remote commands stopped")
        return ExitCode.INTERRUPTED
    results = {h: _with_the_way_out(r) for h, r in restyled(results, CLI_STYLE).items()}
    code = exit_code_for(list(results.values()))
    if args.json:
        print_json_summary(args, results, code)
        return code
    from orchestrator.render import print_grouped, summary_line

    if args.group and wants_plain(sys.stdout):
        print_grouped(results)
    elif args.group:
        from orchestrator.render import print_grouped_rich

        print_grouped_rich(results)
    if not args.group:
        # Grouped by identical error: a thousand unreachable hosts are one line.
        for line in failure_summary(results, host_aliases(cluster_cfg)):
            sys.stderr.write(line + "\n")
    for r in results.values():
        note = r.not_text_note()
        if note is not None and raw is None:
            sys.stderr.write(
                f"{r.host}: {note} (the bytes as they are: `cvs exec -N` on one host)\n"
            )
    truncated = [r for r in results.values() if r.truncated]
    if truncated:
        from orchestrator.render import compress_hosts

        dropped = sum(r.stdout_dropped + r.stderr_dropped for r in truncated)
        sys.stderr.write(
            f"{compress_hosts(r.host for r in truncated)}: results keep the last "
            f"{cluster_cfg.output_tail} of each stream ({dropped} characters dropped from "
            "them; all of it was streamed above)\n"
        )
    sys.stderr.write(summary_line(results) + "\n")
    return code


def _raw_writer(args: argparse.Namespace, hosts: list[str]) -> RawWriter | None:
    """`-N`: the one host's output as it is; a usage error where it cannot be."""
    if not args.no_prefix:
        return None
    if len(hosts) != 1:
        raise UsageError(
            f"cvs exec -N: output without prefixes is for one host ({len(hosts)} selected: "
            "pick one with --hosts)"
        )
    if args.json or args.group:
        raise UsageError("cvs exec -N: output as bytes cannot go with --json or --group")
    return RawWriter()


def _with_the_way_out(result: HostResult) -> HostResult:
    """A container that is not running: the command that starts it (the core
    says what is wrong; the CLI says which of its commands fixes it)."""
    error = result.error or ""
    if result.exit_code == NOT_RUNNING_EXIT and " is not running " in error and "`" not in error:
        return replace(result, error=f"{error} (run `cvs up`)")
    return result


def _env_args(pairs: list[str]) -> dict[str, str]:
    """`-e VAR=VAL` options -> a mapping; a malformed one is a usage error."""
    from orchestrator.config import ENV_NAME_RE

    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not ENV_NAME_RE.match(name):
            raise UsageError(
                f"cvs exec: -e {pair!r}: expected VAR=VALUE with a valid variable name"
            )
        env[name] = value
    return env


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
    from orchestrator.cli.common import host_aliases
    from orchestrator.render import compress_hosts, failure_groups

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
    from orchestrator.config.documents import key_lines
    from orchestrator.containers.hints import hint_for

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
    from orchestrator.render import compress_hosts, failure_groups

    for hosts, text in failure_groups(lines):
        sys.stdout.write(f"{compress_hosts(hosts)} ({len(hosts)}): {text}\n")


@imports_first(*CONNECTING)
def cmd_down(args: argparse.Namespace) -> int:
    from orchestrator.containers.plan.down import down_leftovers

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
    from orchestrator.containers.jobleft import describe

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
        from orchestrator.render import compress_hosts

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
    from orchestrator.containers.status import status_exit_code

    # --json is JSON lines on stdout whatever -o says: its one result line is
    # -o json's document (docs/cli-output.md).
    output = "json" if args.json else getattr(args, "output", None) or "table"
    # Each host's reason is printed with the table (`HOST: reason`), once.
    from orchestrator.containers.jobleft import describe

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
            import yaml

            doc = {"command": "status", "ok": code == 0, "exit_code": int(code), "error": None}
            sys.stdout.write(yaml.safe_dump({**doc, "hosts": hosts, **extra}, sort_keys=False))
        return code
    from orchestrator.render import print_status_table

    # --color always (FORCE_COLOR) keeps the coloured table through a pipe: `| less -R`.
    forced = bool(os.environ.get("FORCE_COLOR")) and not os.environ.get("NO_COLOR")
    plain = wants_plain(sys.stdout) and not forced
    print_status_table(rows, wide=output == "wide", plain=plain, style=CLI_STYLE)
    if jobs:
        sys.stdout.write("containers of Slurm jobs (`cvs down` removes those whose job is over):\n")
        for v in jobs:
            sys.stdout.write(f"  {v.container.host}: {describe(v)}\n")
    return code
