"""`cvs`: the command line. Thin: parse, load, call the API, render.

Exit codes (DESIGN.md): 0 all good, 1 a command failed on some host, 2 usage
or config error, 3 some host unreachable, 4 refused by policy, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from . import __version__
from .config import ConfigError
from .errors import CvsError, PolicyRefused, UsageError
from .events import EventSink, JsonLinesSink, PlainSink, wants_plain
from .results import HostResult, exit_code_for

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_INTERRUPTED = (
    0,
    1,
    2,
    3,
    4,
    130,
)

DEFAULT_SANDBOX_DIR = "/tmp/cvs-sandbox"


def _cluster_path(args: argparse.Namespace) -> Path:
    if args.cluster:
        return Path(args.cluster)
    env = os.environ.get("CVS_CLUSTER")
    if env:
        return Path(env)
    default = Path("cluster.yaml")
    if not default.exists():
        raise UsageError(
            "no cluster file: pass -c FILE, set CVS_CLUSTER, or create ./cluster.yaml "
            "(`cvs sandbox up` writes one for a local sandbox)"
        )
    return default


def load(args: argparse.Namespace, **kwargs: Any) -> Any:
    from .config import load_cluster

    return load_cluster(_cluster_path(args), **kwargs)


def make_sink(args: argparse.Namespace, *, output: bool = True) -> EventSink:
    if args.json:
        return JsonLinesSink(sys.stdout, output=output)
    if wants_plain(sys.stderr):
        return PlainSink(verbose=args.verbose, output=output)
    from .render import RichSink

    return RichSink(verbose=args.verbose, output=output)


def print_json_summary(results: dict[str, HostResult], code: int, **extra: Any) -> None:
    summary = {
        "ok": code == 0,
        "exit_code": code,
        **extra,
        "hosts": {h: r.to_dict() for h, r in results.items()},
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()


# -- commands ---------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    from .config import cluster_warnings, normalized_cluster

    cluster = load(args, check_files=not args.no_check_files)
    doc = normalized_cluster(cluster)
    warnings = cluster_warnings(cluster)
    if args.json:
        sys.stdout.write(json.dumps({"ok": True, "cluster": doc, "warnings": warnings}) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        for w in warnings:
            sys.stderr.write(f"warning: {w}\n")
        sys.stderr.write(f"{_cluster_path(args)}: ok, {len(cluster.hosts)} hosts\n")
    return EXIT_OK


def cmd_exec(args: argparse.Namespace) -> int:
    from .api import Cluster, select_hosts

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("cvs exec: no command given (usage: cvs exec [options] -- CMD ...)")
    cluster_cfg = load(args)
    hosts = select_hosts(cluster_cfg, args.hosts)
    # One argument is taken as shell text (`cvs exec -- 'a | b'`), several as argv.
    remote: str | list[str] = command[0] if len(command) == 1 else command
    sink = make_sink(args, output=not args.group)

    async def main() -> dict[str, HostResult]:
        async with Cluster.open(cluster_cfg, sink=sink) as cluster:
            return await cluster.exec(
                remote, hosts=hosts, timeout=args.timeout, host_os=args.host_os
            )

    try:
        results = anyio.run(main)
    finally:
        sink.close()
    code = exit_code_for(list(results.values()))
    if args.json:
        print_json_summary(results, code)
        return code
    from .render import print_grouped, summary_line

    if args.group:
        print_grouped(results)
    for r in results.values():
        if not r.ok and not args.group:
            sys.stderr.write(f"{r.host}: {r.status}: {r.error}\n")
    sys.stderr.write(summary_line(results) + "\n")
    return code


def _run_async(
    args: argparse.Namespace, work: Callable[[Any], Any], *, output: bool = False
) -> Any:
    """Open the cluster, run `work(cluster)`, close; events go to the chosen sink."""
    from .api import Cluster

    cluster_cfg = load(args)
    sink = make_sink(args, output=output)

    async def main() -> Any:
        async with Cluster.open(cluster_cfg, sink=sink) as cluster:
            return await work(cluster)

    try:
        return anyio.run(main)
    finally:
        sink.close()


def _print_refusal(args: argparse.Namespace, exc: PolicyRefused) -> int:
    if args.json:
        sys.stdout.write(json.dumps({"ok": False, "exit_code": 4, "refused": exc.reasons}) + "\n")
    else:
        sys.stderr.write("cvs: refused, nothing was changed:\n")
        for reason in exc.reasons:
            sys.stderr.write(f"  - {reason}\n")
    return EXIT_REFUSED


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _run_async(args, lambda c: c.plan(force=args.force, reprovision=args.reprovision))
    if args.json:
        doc = {
            "ok": not plan.refused,
            "exit_code": plan.exit_code,
            "lifetime": plan.lifetime,
            "refused": plan.reasons,
            "warnings": plan.warnings,
            "hosts": {h: {"action": a.kind, "reason": a.reason} for h, a in plan.actions.items()},
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        return plan.exit_code
    width = max((len(h) for h in plan.actions), default=4)
    sys.stdout.write(f"lifetime: {plan.lifetime}\n")
    for host, action in plan.actions.items():
        extras = [
            x for x, on in (("provision", action.provision), ("sshd", action.start_sshd)) if on
        ]
        more = f" (+{', '.join(extras)})" if extras else ""
        sys.stdout.write(f"{host:<{width}}  {action.kind:<10} {action.reason}{more}\n")
    for w in plan.warnings:
        sys.stderr.write(f"warning: {w}\n")
    if plan.refused:
        sys.stderr.write("refused:\n")
        for r in plan.reasons:
            sys.stderr.write(f"  - {r}\n")
    return plan.exit_code


def cmd_up(args: argparse.Namespace) -> int:
    try:
        report = _run_async(args, lambda c: c.up(force=args.force, reprovision=args.reprovision))
    except PolicyRefused as exc:
        return _print_refusal(args, exc)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict()) + "\n")
        return report.exit_code
    for host, outcome in report.outcomes.items():
        if outcome.ok:
            steps = ", ".join(name for name, _ in outcome.steps) or "nothing to do"
            sys.stderr.write(f"{host}: {outcome.action.kind} ok ({steps})\n")
        else:
            sys.stderr.write(f"{host}: {outcome.action.kind} FAILED at {outcome.error}\n")
    ok = sum(o.ok for o in report.outcomes.values())
    sys.stderr.write(f"up: {ok}/{len(report.outcomes)} hosts ready\n")
    return report.exit_code


def cmd_down(args: argparse.Namespace) -> int:
    plan, results = _run_async(args, lambda c: c.down(force=args.force))
    code = exit_code_for(list(results.values())) if results else 0
    if plan.unknown_hosts:
        code = max(code, EXIT_UNREACHABLE)
    if args.json:
        doc = {
            "ok": code == 0,
            "exit_code": code,
            "warnings": plan.warnings,
            "hosts": {h: {"action": a.kind, "reason": a.reason} for h, a in plan.actions.items()},
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        return code
    for w in plan.warnings:
        sys.stderr.write(f"warning: {w}\n")
    for host, action in plan.actions.items():
        r = results.get(host)
        done = "" if r is None else (" ok" if r.ok else f" FAILED: {r.error}")
        sys.stderr.write(f"{host}: {action.reason}{done}\n")
    return code


def cmd_status(args: argparse.Namespace) -> int:
    rows = _run_async(args, lambda c: c.status())
    code = EXIT_UNREACHABLE if any(not r["reachable"] for r in rows) else EXIT_OK
    if args.json:
        sys.stdout.write(json.dumps({"ok": code == 0, "exit_code": code, "hosts": rows}) + "\n")
        return code
    from .render import print_status

    print_status(rows, plain=wants_plain(sys.stdout))
    return code


def cmd_sandbox(args: argparse.Namespace) -> int:
    from .sandbox import SandboxError, sandbox_down, sandbox_up

    directory = Path(args.dir or os.environ.get("CVS_SANDBOX_DIR") or DEFAULT_SANDBOX_DIR)

    def progress(text: str) -> None:
        if not args.json:
            sys.stderr.write(f"sandbox: {text}\n")
            sys.stderr.flush()

    try:
        if args.sandbox_command == "up":
            if args.hosts < 1:
                raise UsageError("cvs sandbox up: --hosts must be at least 1")
            box = sandbox_up(directory, args.hosts, egress_host=args.egress, progress=progress)
            if args.lifetime != "per_run":
                _set_sandbox_lifetime(box.cluster_file, args.lifetime)
            if args.json:
                sys.stdout.write(json.dumps({"ok": True, "cluster": str(box.cluster_file)}) + "\n")
            else:
                sys.stdout.write(f"{box.cluster_file}\n")
        else:
            sandbox_down(directory, progress=progress)
    except SandboxError as exc:
        sys.stderr.write(f"cvs sandbox: {exc}\n")
        return EXIT_USAGE
    return EXIT_OK


def _set_sandbox_lifetime(path: Path, lifetime: str) -> None:
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["container"]["lifetime"] = lifetime
    header = "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#"))
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))


# -- parser -----------------------------------------------------------------

EPILOG = """\
exit codes: 0 ok · 1 a command failed on some host · 2 usage or config error ·
3 some host unreachable · 4 refused by policy · 130 interrupted

Start here:  cvs sandbox up --hosts 4      # a local 4-host cluster, prints its cluster.yaml
             cvs -c /tmp/cvs-sandbox/cluster.yaml exec -- hostname
"""


def _common_options(*, subcommand: bool) -> argparse.ArgumentParser:
    """-c/--json/-v, accepted before and after the subcommand.

    A subparser writes its defaults over what the main parser parsed, so in
    subcommands they default to SUPPRESS: otherwise `cvs -c FILE up` would
    silently drop FILE. (Separate parsers: `parents` shares Action objects.)
    """
    common = argparse.ArgumentParser(add_help=False)
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if subcommand else {}
    common.add_argument(
        "-c",
        "--cluster",
        metavar="FILE",
        help="cluster file (default: $CVS_CLUSTER, then ./cluster.yaml)",
        **unset,
    )
    common.add_argument("--json", action="store_true", help="JSON lines on stdout", **unset)
    common.add_argument(
        "-v", "--verbose", action="store_true", help="more progress detail", **unset
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(subcommand=True)

    parser = argparse.ArgumentParser(
        prog="cvs",
        description="Keep one named test container per GPU host in the state a run needs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common_options(subcommand=False)],
    )
    parser.add_argument("--version", action="version", version=f"cvs {__version__}")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "validate",
        parents=[common],
        help="check a cluster file and print it normalized",
        description="Load the cluster file, expand hostlists, fill defaults, print the result. "
        "Exit 2 with one line naming the file and key on any problem.",
    )
    p.add_argument(
        "--no-check-files",
        action="store_true",
        help="do not require identity files and setup scripts to exist here",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "exec",
        parents=[common],
        help="run a command on every host (in the container when there is one)",
        description="Run CMD on the selected hosts at once, over one SSH connection per host. "
        "With a container block and a running container, CMD runs inside it; "
        "--host-os runs it on the host itself. One argument is shell text; several are argv.",
        epilog="example: cvs exec --hosts 'node[1-2]' --timeout 30 -- nvidia-smi -L",
    )
    p.add_argument("--hosts", metavar="PATTERN", help="names, globs or hostlists, comma-separated")
    p.add_argument("--timeout", type=float, metavar="S", help="per-host timeout in seconds")
    p.add_argument("--group", action="store_true", help="fold identical output (like dshbak -c)")
    p.add_argument("--host-os", action="store_true", help="run on the host, not in the container")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(func=cmd_exec)

    lifecycle_epilog = (
        "lifetimes: no_launch (use running containers, never start any), per_run (fresh each "
        "run, removed by down), persistent (kept between runs; a partial set is refused)"
    )
    p = sub.add_parser(
        "plan",
        parents=[common],
        help="show what `up` would do on each host (dry run)",
        description="Probe every host (one round trip each) and print the action `up` would take "
        "and why. Changes nothing. Exit 4 when `up` would be refused.",
        epilog=lifecycle_epilog,
    )
    p.add_argument("--force", action="store_true", help="plan as `up --force` would")
    p.add_argument("--reprovision", action="store_true", help="plan as `up --reprovision` would")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "up",
        parents=[common],
        help="bring the containers up per the lifetime policy",
        description="Lock and probe every host, decide per the lifetime policy, then on each host "
        "independently: pull/load, run, provision (setup script), start the in-container sshd. "
        "Exit 4 (nothing changed) when refused: partial persistent set, image skew, unreadable "
        "image, unknown host state.",
        epilog=lifecycle_epilog,
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace containers instead of refusing (removes persistent or foreign ones)",
    )
    p.add_argument(
        "--reprovision", action="store_true", help="run the setup script again on kept containers"
    )
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "status",
        parents=[common],
        help="table of hosts: container, image, sshd, provisioning, drift",
        description="Probe every host and show reachability, docker access, container state, "
        "image and tag IDs (stale?), sshd, provisioning marker, effective limits and drift.",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "down",
        parents=[common],
        help="remove containers per the lifetime (persistent: only with --force)",
        description="per_run: remove our containers. persistent: keep them (--force removes). "
        "no_launch: nothing. A same-named container cvs did not create is kept unless --force.",
    )
    p.add_argument("--force", action="store_true", help="also remove persistent/foreign ones")
    p.set_defaults(func=cmd_down)

    from .suite_cli import add_run_parser

    add_run_parser(sub, common)

    p = sub.add_parser(
        "sandbox",
        parents=[common],
        help="a local multi-host cluster on this machine (root)",
        description="Build or remove a sandbox cluster: N network namespaces on a private bridge, "
        "each with its own sshd and dockerd, and a cluster.yaml to drive them.",
    )
    sandbox_sub = p.add_subparsers(dest="sandbox_command", metavar="up|down", required=True)
    up = sandbox_sub.add_parser("up", parents=[common], help="build the sandbox")
    up.add_argument("--hosts", type=int, default=4, help="number of hosts (default 4)")
    up.add_argument("--dir", help=f"where it lives (default {DEFAULT_SANDBOX_DIR})")
    up.add_argument(
        "--lifetime",
        choices=["per_run", "persistent", "no_launch"],
        default="per_run",
        help="container lifetime written into the cluster file (default per_run)",
    )
    up.add_argument(
        "--egress", action="store_true", help="add a host whose containers reach Debian mirrors"
    )
    down = sandbox_sub.add_parser("down", parents=[common], help="remove everything it made")
    down.add_argument("--dir", help=f"where it lives (default {DEFAULT_SANDBOX_DIR})")
    p.set_defaults(func=cmd_sandbox)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        sys.stderr.write("cvs: interrupted\n")
        return EXIT_INTERRUPTED
    except PolicyRefused as exc:
        return _print_refusal(args, exc)
    except ConfigError as exc:
        sys.stderr.write(f"cvs: {exc}\n")
        return EXIT_USAGE
    except CvsError as exc:
        sys.stderr.write(f"cvs: {exc}\n")
        return exc.exit_code
    except ValueError as exc:
        from .api import HostSelectionError

        if isinstance(exc, HostSelectionError):
            sys.stderr.write(f"cvs: {exc}\n")
            return EXIT_USAGE
        raise
