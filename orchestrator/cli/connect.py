"""The helper of the commands that connect: open the cluster through the API,
run the command's work, close. Apart from `common` so that the commands that
connect nowhere (`validate`) never import the API, nor asyncssh with it."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from orchestrator.api import Cluster
from orchestrator.cli.common import CLI_STYLE, load, make_sink
from orchestrator.errors import restyled

_T = TypeVar("_T")


def run_with_cluster(
    args: argparse.Namespace,
    work: Callable[[Cluster], Awaitable[_T]],
    *,
    output: bool = False,
    connect_failures: bool = True,
) -> _T:
    """Open the cluster, run `work(cluster)`, close; events go to the chosen sink.
    `connect_failures` False: the command reports them itself (not twice)."""
    cluster_cfg = load(args)
    sink = make_sink(args, output=output, cluster=cluster_cfg)
    if hasattr(sink, "connect_failures"):
        sink.connect_failures = connect_failures

    async def main() -> _T:
        async with Cluster.open(cluster_cfg, sink=sink) as cluster:
            # What the API hands back, in the CLI's words from here on.
            return restyled(await work(cluster), CLI_STYLE)

    try:
        return anyio.run(main)
    finally:
        sink.close()
