"""Helpers every command module shares: the cluster path, loading, sinks, JSON, refusals."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from orchestrator.cli.writer import BackgroundWriter
from orchestrator.config import load_cluster
from orchestrator.config.hostlist import split_patterns
from orchestrator.config.selection import select_hosts
from orchestrator.errors import (
    Call,
    ExitCode,
    Option,
    Param,
    Phrase,
    PolicyRefused,
    Refusal,
    Text,
    UsageError,
    restyled,
    say,
)
from orchestrator.events import EventSink, JsonLinesSink, PlainSink, wants_plain
from orchestrator.render import compress_hosts, failure_groups
from orchestrator.results import HostResult

if TYPE_CHECKING:
    pass

_T = TypeVar("_T")

DEFAULT_SANDBOX_DIR = "/tmp/cvs-sandbox"
# What a command that connects imports when it runs, imported before the
# collector is tuned (cli/collector.py, `imports_first`).
CONNECTING = ("orchestrator.api",)


def cluster_path(args: argparse.Namespace) -> Path:
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
    """The cluster file, with the command line's --hosts-from and --forks/--limit applied."""
    hosts_from = getattr(args, "hosts_from", None)
    if getattr(args, "job_over_ok", False):  # `down`, `status`: what an ended job left
        kwargs.setdefault("job_over_ok", True)
    cluster = load_cluster(cluster_path(args), hosts_from=hosts_from, **kwargs)
    if cluster.slurm is not None:
        # Every --json result of this invocation names the job (write_json_result).
        args.slurm_job = cluster.slurm.job_id
    if getattr(args, "narrow_hosts", False) and (
        getattr(args, "hosts", None) or getattr(args, "exclude", None)
    ):
        keep = set(chosen_hosts(cluster, args))
        hosts = [h for h in cluster.hosts if h.name in keep]
        head = cluster.head if cluster.head in keep else None
        cluster = cluster.model_copy(update={"hosts": hosts, "head": head})
    forks = getattr(args, "forks", None)
    if forks:
        concurrency = cluster.concurrency.model_copy(update={"hosts": forks})
        cluster = cluster.model_copy(update={"concurrency": concurrency})
    return cluster


def chosen_hosts(cluster: Any, args: argparse.Namespace) -> list[str]:
    """--hosts minus -x/--exclude, in cluster order; UsageError when nothing is left."""
    hosts = select_hosts(cluster, getattr(args, "hosts", None))
    exclude = getattr(args, "exclude", None)
    if not exclude:
        return hosts
    # Unlike pdsh -x, a part that matches no host is an error: a typo in an
    # exclusion would otherwise run the command on the host meant to be spared.
    dropped: set[str] = set()
    for part in split_patterns(exclude):
        try:
            dropped.update(select_hosts(cluster, part))
        except UsageError as exc:
            raise UsageError(cli_message(exc).replace("--hosts", "--exclude", 1)) from None
    left = [h for h in hosts if h not in dropped]
    if not left:
        raise UsageError(f"--exclude {exclude!r} leaves no host (selected: {len(hosts)})")
    return left


def only_hosts(cluster: Any, args: argparse.Namespace) -> list[str] | None:
    """The hosts --hosts/-x pick, or None without either: for the commands that
    decide over the whole cluster and act on a part (`up`, `plan`)."""
    if getattr(args, "hosts", None) or getattr(args, "exclude", None):
        return chosen_hosts(cluster, args)
    return None


def make_sink(args: argparse.Namespace, *, output: bool = True, cluster: Any = None) -> EventSink:
    """JSON lines with --json; else the mode follows stdout, where host output goes:
    the live view on a terminal, `host | line` text when piped (cvs's own
    messages go to stderr either way). With `cluster`, the text sinks know the
    hosts' addresses, so an error naming them prints once, not once per host."""
    if args.json:
        json_sink = JsonLinesSink(sys.stdout, output=output)
        json_sink.style = CLI_STYLE
        return json_sink
    sink: PlainSink | Any
    if wants_plain(sys.stdout):
        sink = PlainSink(verbose=args.verbose, output=output)
    else:
        # rich only on a terminal: piped output never loads it (tests/test_startup.py).
        from orchestrator.render.live import RichSink

        sink = RichSink(verbose=args.verbose, output=output)
    sink.style = CLI_STYLE
    if cluster is not None:
        sink.seen.aliases = host_aliases(cluster)
    return sink


def command_name(args: argparse.Namespace) -> str | None:
    """`exec`, `run`, `sandbox up`, ...: the `command` of the `--json` result line."""
    name = getattr(args, "command_name", None)
    sub = getattr(args, "sandbox_command", None)
    return f"{name} {sub}" if name and sub else name


def write_json_result(
    args: argparse.Namespace,
    *,
    ok: bool,
    exit_code: int,
    error: str | None = None,
    **fields: Any,
) -> None:
    """The last line of every `--json` invocation, errors included: one shape,
    `orchestrator/schemas/cli.schema.json` (events come before it, one per line)."""
    doc = {
        "command": command_name(args),
        "ok": bool(ok),
        "exit_code": int(exit_code),
        "error": error,
        **({"slurm_job": args.slurm_job} if getattr(args, "slurm_job", None) else {}),
        **fields,
    }
    doc = restyled(doc, CLI_STYLE)
    sys.stdout.write(json.dumps(doc, default=str) + "\n")
    sys.stdout.flush()


def host_aliases(cluster: Any) -> dict[str, list[str]]:
    """Per host, the other names an error may call it by (address, VPC address):
    set aside when errors are compared, so the same error on many hosts folds."""
    return {
        h.name: [a for a in (h.address, h.vpc_address) if a] for h in getattr(cluster, "hosts", [])
    }


def failure_summary(
    results: dict[str, HostResult], aliases: dict[str, list[str]] | None = None
) -> list[str]:
    """One line per distinct failure, hosts folded: `node[2-4] (3): failed: exit code 1`."""
    errors = {
        h: f"{r.status}: {cli_text(r.error)}" if r.error else r.status for h, r in results.items()
    }
    groups = failure_groups({h: e for h, e in errors.items() if not results[h].ok}, aliases)
    return [f"{compress_hosts(hosts)} ({len(hosts)}): {error}" for hosts, error in groups]


def print_json_summary(
    args: argparse.Namespace, results: dict[str, HostResult], code: int, **extra: Any
) -> None:
    write_json_result(
        args,
        ok=code == 0,
        exit_code=code,
        error="; ".join(failure_summary(results)) or None,
        **extra,
        hosts={h: r.to_dict() for h, r in results.items()},
    )


@contextlib.asynccontextmanager
async def while_stdout_is_read(sink: EventSink | RawWriter) -> AsyncIterator[Any]:
    """A cancel scope for the work that is cancelled once whoever reads our
    stdout goes away (`cvs exec ... | head -1`), so remote commands stop
    instead of running on unread; the caller sees it as `cancelled_caught`.

    A pipe or socket is watched: the kernel reports its closed read end as an
    error condition on our end, at once, even while the command prints
    nothing. Anything else (a terminal, a file) cannot lose its reader; the
    sinks also stop at the first write that fails (`on_broken`).
    """
    with anyio.CancelScope() as scope:
        if hasattr(sink, "on_broken"):
            sink.on_broken = scope.cancel
        async with anyio.create_task_group() as watchers:
            if _stdout_is_a_pipe():
                watchers.start_soon(_cancel_when_reader_leaves, scope)
            try:
                yield scope
            finally:
                watchers.cancel_scope.cancel()


class RawWriter:
    """`cvs exec -N`: a host's stdout and stderr onto ours, byte for byte, as
    they come (`Cluster.exec(raw_output=...)`). A reader of our stdout that
    went away stops the commands, as the sinks do (`on_broken`)."""

    on_broken: Callable[[], None] | None = None

    def __init__(self) -> None:
        self.broken = False

    def __call__(self, stream: str, data: bytes) -> None:
        out = sys.stderr if stream == "stderr" else sys.stdout
        if self.broken and out is sys.stdout:
            return
        try:
            out.buffer.write(data)
            out.buffer.flush()
        except BrokenPipeError:
            if out is not sys.stdout:
                return
            self.broken = True
            with contextlib.suppress(OSError, ValueError):
                fd = os.open(os.devnull, os.O_WRONLY)
                os.dup2(fd, sys.stdout.fileno())
                os.close(fd)
            if self.on_broken is not None:
                self.on_broken()


def stdin_to_pass() -> int | None:
    """Our stdin's descriptor when `cvs exec` passes it to the commands: not
    when it is a terminal (nobody means to type into every host: ssh -n's
    habit without the option) or /dev/null, or closed (None)."""
    try:
        st = os.fstat(0)
        if os.isatty(0):
            return None
        null = os.stat(os.devnull)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev:
        return None
    return 0


def _stdout_is_a_pipe() -> bool:
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


async def _cancel_when_reader_leaves(scope: Any) -> None:
    try:
        # Never readable: what wakes this is the error condition (EPOLLERR)
        # of a pipe whose read end closed, which the event loop reports as
        # readable.
        await anyio.wait_readable(sys.stdout.fileno())
    except OSError:
        return  # cannot be watched here: the next failed write tells instead
    scope.cancel()


# --- refusals, as the CLI says them ----------------------------------------------

# The API keyword each flag sets (errors.Option): what a refusal's ways out,
# and any errors.Phrase, are rendered as here. A keyword without a flag never
# reaches one (tests/test_cli_words.py checks every one the core names).
_FLAGS: dict[tuple[str, bool], str] = {
    ("force", True): "--force",
    ("adopt", True): "--adopt",
    ("reprovision", True): "--reprovision",
    ("heal", True): "--heal",
    ("wait", False): "--no-wait",
    ("stdin", False): "--no-stdin",
}
# The API parameter each flag gives a value to (errors.Param).
_PARAMS: dict[str, str] = {
    "hosts": "--hosts",
    "hosts_from": "--hosts-from",
    "run_dir": "--run-dir",
}


class CliStyle:
    """Options as flags, parameters as the flags that set them and calls as
    `cvs` commands (errors.Style): refusals, warnings, reasons, messages."""

    def option(self, option: Option) -> str:
        flag = _FLAGS.get((option.name, option.value))
        if flag is None:  # the flag that turns it off, said as "without"
            off = _FLAGS.get((option.name, not option.value))
            return f"without {off}" if off else f"{option.name}={option.value}"
        return flag

    def param(self, param: Param) -> str:
        return _PARAMS.get(param.name, param.name)

    def again(self, options: Sequence[Option]) -> str:
        on = [_FLAGS[(o.name, o.value)] for o in options if (o.name, o.value) in _FLAGS]
        off = [_FLAGS[(o.name, not o.value)] for o in options if (o.name, not o.value) in _FLAGS]
        parts = [f"rerun with {' '.join(on)}"] if on else []
        parts += [f"rerun without {' '.join(off)}"] if off else []
        return " and ".join(parts) or "rerun"

    def calls(self, calls: Sequence[Call]) -> str:
        commands = [
            " ".join(["cvs", c.name, *(_FLAGS[(o.name, o.value)] for o in c.options)])
            for c in calls
        ]
        return f"`{' && '.join(commands)}`"


CLI_STYLE = CliStyle()


def cli_text(text: Text) -> str:
    """A message from below the CLI (a plain str, or an errors.Phrase) in its words."""
    return say(text, CLI_STYLE)


def cli_message(exc: BaseException) -> str:
    """An error's one line in the CLI's words (its message may be an errors.Phrase)."""
    if len(exc.args) == 1 and isinstance(exc.args[0], str | Phrase):
        return cli_text(exc.args[0])
    return str(exc)


def cli_reasons(refusals: Sequence[Refusal]) -> list[str]:
    """The refusals as the CLI prints them (flags, `cvs` commands)."""
    return list(dict.fromkeys(r.render(CLI_STYLE) for r in refusals))


_ALREADY_SAID = re.compile(r"[;,] (?:so )?nothing was changed([.:])")


def print_refusal(args: argparse.Namespace, exc: PolicyRefused) -> int:
    reasons = cli_reasons(exc.refusals)
    if args.json:
        write_json_result(
            args,
            ok=False,
            exit_code=ExitCode.REFUSED,
            error=f"refused: {'; '.join(reasons)}",
            refused=reasons,
        )
    else:
        changed = exc.changed
        if changed:
            # True words: the refusal came after something was done.
            done = "; ".join(changed)
            sys.stderr.write(f"cvs: refused (no container changed; done before: {done}):\n")
        else:
            sys.stderr.write("cvs: refused, nothing was changed:\n")
        for reason in reasons:
            # The header says it once; the reasons (written to stand alone, as in
            # --json) need not repeat it under it.
            shown = _ALREADY_SAID.sub(r"\1", reason)
            sys.stderr.write(f"  - {shown}\n")
    return ExitCode.REFUSED


def tell_stdout_closed(what: str) -> None:
    """The command's own line for a reader gone away (`cvs run ... | head -1`):
    what it stopped. Said once: the entry point does not add its own."""
    sys.stderr.write(f"cvs: stdout closed by its reader: {what}\n")
    if isinstance(sys.stdout, BackgroundWriter):
        sys.stdout.told = True
