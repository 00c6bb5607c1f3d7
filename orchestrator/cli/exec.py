"""`cvs exec`: run a command on the chosen hosts (in their containers, or on
the hosts with --host-os). Imports only what `cvs exec` uses: its start-up is
what every `cvs exec` pays (tests/test_startup.py)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import anyio

from orchestrator.api import Cluster
from orchestrator.cli.collector import imports_first
from orchestrator.cli.common import (
    CLI_STYLE,
    CONNECTING,
    RawWriter,
    chosen_hosts,
    failure_summary,
    host_aliases,
    load,
    make_sink,
    print_json_summary,
    stdin_to_pass,
    tell_stdout_closed,
    while_stdout_is_read,
)
from orchestrator.config import ENV_NAME_RE
from orchestrator.containers.exec import NOT_RUNNING_EXIT
from orchestrator.errors import ExitCode, UsageError, restyled
from orchestrator.events import wants_plain
from orchestrator.render import compress_hosts, print_grouped, summary_line
from orchestrator.results import HostResult, exit_code_for


@imports_first(*CONNECTING)
def cmd_exec(args: argparse.Namespace) -> int:
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
    if args.group and wants_plain(sys.stdout):
        print_grouped(results)
    elif args.group:
        # rich only on a terminal: piped output never loads it (tests/test_startup.py).
        from orchestrator.render.live import print_grouped_rich

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
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not ENV_NAME_RE.match(name):
            raise UsageError(
                f"cvs exec: -e {pair!r}: expected VAR=VALUE with a valid variable name"
            )
        env[name] = value
    return env
