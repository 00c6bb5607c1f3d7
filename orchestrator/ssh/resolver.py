"""Threads for the blocking parts of a connect: name resolution and asyncssh's
options.

Why: asyncio resolves a host name (`loop.getaddrinfo`) and asyncssh builds a
connection's options (`SSHClientConnectionOptions.construct`) in the event
loop's default executor, `min(32, cores + 4)` threads: 6 on 2 cores. A name
the resolver cannot answer holds its thread for the resolver's own time
(a round trip to a DNS server, or its timeout), and every other connect of
the fleet queues behind those 6 threads, before `connect_timeout` starts.
So a one-host `cvs plan` of a 5000-host file (which probes every host,
docs/cli-output.md) took minutes on names that do not resolve (issue 42,
item 11). The handshakes in flight are already bounded by the admission
window (admission.py, 64 to start with); the threads now match it, so
resolution goes as wide as the connects it serves.

One executor per event loop, set before its first connect. The loop shuts
it down when it closes (asyncio.run, anyio.run), as it would the default.
"""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor

# The admission window's start (admission.AimdWindow.initial): as many
# resolutions at once as handshakes admitted at once.
RESOLVER_THREADS = 64

_equipped: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def widen_default_executor(threads: int = RESOLVER_THREADS) -> None:
    """Give the running asyncio loop a default executor of `threads` threads,
    once per loop (no-op on another backend's loop or when already done)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # not on asyncio (trio): its resolver has its own threads
    if loop in _equipped:
        return
    _equipped.add(loop)
    loop.set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="cvs-resolve"))
