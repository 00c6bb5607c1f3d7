"""`cvs cp`: a file or directory to every host, or one file back from each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio

from orchestrator.api import Cluster
from orchestrator.cli.collector import imports_first
from orchestrator.cli.common import (
    CLI_STYLE,
    CONNECTING,
    chosen_hosts,
    cli_message,
    cli_text,
    load,
    make_sink,
    print_json_summary,
)
from orchestrator.containers.copy import CopyError, Payload
from orchestrator.errors import UsageError, restyled
from orchestrator.events import EventSink, PlainSink, wants_plain
from orchestrator.render import summary_line
from orchestrator.results import HostResult, exit_code_for


@contextmanager
def progress_bar(
    label: str, total: int | None, *, show: bool
) -> Iterator[Callable[[str, int], None]]:
    """A rich progress bar on stderr (bytes over all hosts); a no-op when not shown."""
    if not show:
        yield lambda host, n: None
        return
    # rich only for a bar shown on a terminal: piped `cvs cp` never loads it.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda host, n: bar.advance(task, n)


@imports_first(*CONNECTING)
def cmd_cp(args: argparse.Namespace) -> int:
    cluster_cfg = load(args)
    hosts = chosen_hosts(cluster_cfg, args)
    show = not args.json and not wants_plain(sys.stderr)
    # The progress bar is the live view: a second live display (the rich sink's
    # host rows) would fight it for the terminal, so only lines go beside it.
    sink: EventSink
    if show:
        plain = PlainSink(output=False)
        plain.style = CLI_STYLE
        sink = plain
    else:
        sink = make_sink(args, output=False)
    payload = None
    try:
        if not args.from_host:
            payload = Payload.from_path(Path(args.src))
        dest_dir = Path(args.dest)
        if args.from_host and dest_dir.exists() and not dest_dir.is_dir():
            raise UsageError(f"cvs cp --from-host: {dest_dir} exists and is not a directory")

        async def main() -> dict[str, HostResult]:
            async with Cluster.open(cluster_cfg, sink=sink) as cluster:
                if payload is None:
                    with progress_bar(f"{args.src} <- {len(hosts)} hosts", None, show=show) as bar:
                        return await cluster.copy_from(
                            args.src,
                            dest_dir,
                            hosts=hosts,
                            host_os=args.host_os,
                            timeout=args.timeout,
                            progress=bar,
                        )
                total = payload.size * len(hosts)
                label = f"{payload.source.name} -> {len(hosts)} hosts"
                with progress_bar(label, total, show=show) as bar:
                    return await cluster.copy_to(
                        payload,
                        args.dest,
                        hosts=hosts,
                        host_os=args.host_os,
                        timeout=args.timeout,
                        progress=bar,
                    )

        results = restyled(anyio.run(main), CLI_STYLE)
    except CopyError as exc:
        raise UsageError(f"cp: {cli_message(exc)}") from None
    finally:
        sink.close()
        if payload is not None:
            payload.close()
    code = exit_code_for(list(results.values()))
    if args.json:
        print_json_summary(args, results, code)
        return code
    # The command's result, each host's and the count: stdout (docs/cli-output.md).
    width = max(len(h) for h in results)
    for host, r in results.items():
        text = r.stdout if r.ok else f"{r.status}: {cli_text(r.error or '')}"
        sys.stdout.write(f"{host:<{width}}  {text}\n")
    sys.stdout.write(summary_line(results) + "\n")
    return code
