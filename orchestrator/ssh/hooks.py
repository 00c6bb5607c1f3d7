"""Every use of asyncssh's internals, in one place, on the versions they were tested on.

Three of asyncssh's private parts save the 40 ms waits ssh/segments.py and
ssh/container_channel.py explain: a connection's asyncio transport
(`conn._transport`, whose writes `coalesce_writes` gathers), an
SSH_MSG_IGNORE sent on a connection (`send_packet`, `MSG_IGNORE`: an answer
that says nothing) and a global request (`_make_global_request`: a round
trip that runs nothing). asyncssh may rename or change any of them in a
release, so each hook here works only on the asyncssh versions pyproject
pins (`TESTED`, held to the pin by tests/test_hooks.py, and CI runs the
hooks' tests on the oldest of them). On another version, or where a part is
missing, the hook declines: the plain behaviour (asyncssh's own writes, no
answer, `true` for the round trip), said once at debug level on the
`cvs.ssh` logger. Never a crash, never a wait of its own.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from orchestrator.ssh.libsearch import asyncssh

# asyncssh's internal names for SSH_MSG_IGNORE; where a version moved them,
# send_ignore declines (why: _NO_IGNORE) instead of failing the import.
_NO_IGNORE: str | None = None
try:
    from asyncssh.constants import MSG_IGNORE
    from asyncssh.packet import String
except ImportError as exc:
    _NO_IGNORE = str(exc)

# The asyncssh versions the hooks were tested on: >= the first, < the second
# (pyproject's `asyncssh>=2.14,<2.25`).
TESTED: tuple[tuple[int, int], tuple[int, int]] = ((2, 14), (2, 25))

log = logging.getLogger("cvs.ssh")
_said: set[str] = set()


def version_of(text: str) -> tuple[int, int] | None:
    """`2.24.1` -> (2, 24); None when it does not start with N.N."""
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def tested(version: str) -> bool:
    """Whether asyncssh `version` is one the hooks were tested on."""
    got = version_of(version)
    return got is not None and TESTED[0] <= got < TESTED[1]


def _declined(what: str, why: str) -> None:
    if what not in _said:
        _said.add(what)
        log.debug("asyncssh hook %s declined (%s): asyncssh's own behaviour instead", what, why)


def _usable(what: str, target: Any, attribute: str) -> bool:
    version = getattr(asyncssh, "__version__", "?")
    if not tested(version):
        low, high = TESTED
        _declined(what, f"asyncssh {version} is outside {low[0]}.{low[1]}-{high[0]}.{high[1] - 1}")
        return False
    if not hasattr(target, attribute):
        _declined(what, f"asyncssh {version} has no {type(target).__name__}.{attribute}")
        return False
    return True


def raw_transport(conn: Any) -> Any:
    """The asyncio transport under asyncssh connection `conn` (to gather its
    writes), or None where the hook declines."""
    if not _usable("raw_transport", conn, "_transport"):
        return None
    return conn._transport


def send_ignore(conn: Any) -> bool:
    """Send an SSH_MSG_IGNORE on `conn` (an asyncssh connection): an answer
    that says nothing, so the peer's kernel acknowledges at once. False where
    the hook declines (nothing is sent)."""
    if not _usable("send_ignore", conn, "send_packet"):
        return False
    if _NO_IGNORE is not None:
        _declined("send_ignore", _NO_IGNORE)
        return False
    conn.send_packet(MSG_IGNORE, String(b""))
    return True


async def round_trip(conn: Any) -> None:
    """One round trip on `conn` that runs nothing in the peer (a keepalive
    request); where the hook declines, `true` (a process, the same round
    trip's effect on the peers' acknowledgements)."""
    if _usable("round_trip", conn, "_make_global_request"):
        await conn._make_global_request(b"keepalive@openssh.com")
    else:
        await conn.run("true", check=False)
