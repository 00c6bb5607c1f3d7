"""Helpers every command module shares: the cluster path, loading, sinks, JSON, refusals."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

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
from orchestrator.results import HostResult

if TYPE_CHECKING:
    from orchestrator.api import Cluster

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
    from orchestrator.config import load_cluster

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
    from orchestrator.api import select_hosts

    hosts = select_hosts(cluster, getattr(args, "hosts", None))
    exclude = getattr(args, "exclude", None)
    if not exclude:
        return hosts
    # Unlike pdsh -x, a part that matches no host is an error: a typo in an
    # exclusion would otherwise run the command on the host meant to be spared.
    from orchestrator.config.hostlist import split_patterns

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
        from orchestrator.render import RichSink

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
    from orchestrator.render import compress_hosts, failure_groups

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


def run_with_cluster(
    args: argparse.Namespace,
    work: Callable[[Cluster], Awaitable[_T]],
    *,
    output: bool = False,
    connect_failures: bool = True,
) -> _T:
    """Open the cluster, run `work(cluster)`, close; events go to the chosen sink.
    `connect_failures` False: the command reports them itself (not twice)."""
    from orchestrator.api import Cluster

    cluster_cfg = load(args)
    sink = make_sink(args, output=output, cluster=cluster_cfg)
    if hasattr(sink, "connect_failures"):
        sink.connect_failures = connect_failures

    async def main() -> _T:
        async with Cluster.open(cluster_cfg, sink=sink) as cluster:
            # What the API hands back, in the CLI's words from here on.
            return restyled(await work(cluster), CLI_STYLE)

    try:
        import anyio

        return anyio.run(main)
    finally:
        sink.close()


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
    import anyio

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
    import anyio

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


class BackgroundWriter:
    """A text stream written by a thread, so a full pipe blocks that thread and
    never the event loop: a reader that stops reading our output must not keep
    the hosts' locks held (the work goes on and releases them; the output waits).

    Memory stays bounded: past `limit` characters queued, what comes next is
    spilled to an unlinked temporary file and written from there, in order.
    `drain()` (at exit, after the work) writes what is left.
    """

    def __init__(self, stream: Any, limit: int = 16 << 20) -> None:
        import collections
        import threading

        self._stream = stream
        self._limit = limit
        self._queue: collections.deque[str] = collections.deque()
        self._size = 0
        self._spill: IO[str] | None = None  # temporary file once the queue is full
        self._spill_read = 0
        self._spill_write = 0
        self._closed = False
        self._error: OSError | None = None  # the write that failed (reader gone)
        # The command said itself what a closed stdout stopped (tell_stdout_closed).
        self.told = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="cvs-output", daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        if self._error is not None:
            # The reader went away: say so to the caller (the sinks stop the
            # run on a BrokenPipeError), in the caller's thread.
            raise type(self._error)(*self._error.args)
        with self._cv:
            if self._spill is not None or self._size + len(text) > self._limit:
                self._to_spill(text)
            else:
                self._queue.append(text)
                self._size += len(text)
            self._cv.notify_all()
        return len(text)

    def _to_spill(self, text: str) -> None:
        import tempfile

        if self._spill is None:
            self._spill = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed by the writer thread once drained)
            self._spill_read = self._spill_write = self._spill.tell()
        self._spill.seek(self._spill_write)
        self._spill.write(text)
        self._spill_write = self._spill.tell()

    def _next_chunk(self) -> str | None:
        """What to write next, in order (queue first, then the spill); None: done."""
        with self._cv:
            while not self._queue and self._spill is None and not self._closed:
                self._cv.wait()
            if self._queue:
                chunk = "".join(self._queue)
                self._queue.clear()
                self._size = 0
                return chunk
            if self._spill is not None:
                self._spill.flush()
                self._spill.seek(self._spill_read)
                chunk = self._spill.read(1 << 20)
                self._spill_read = self._spill.tell()
                if self._spill_read == self._spill_write:
                    self._spill.close()
                    self._spill = None
                return chunk
            return None

    def flush(self) -> None:
        """Nothing to wait for: the thread flushes after every chunk it writes."""

    def _run(self) -> None:
        broken = False
        while (chunk := self._next_chunk()) is not None:
            if broken:
                continue
            try:
                self._stream.write(chunk)
                self._stream.flush()
            except OSError as exc:
                broken, self._error = True, exc  # the reader went away: drop the rest
            except ValueError:
                broken = True

    @property
    def broken(self) -> bool:
        """Its reader went away (a write failed): what comes next is dropped."""
        return self._error is not None

    def drain(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
