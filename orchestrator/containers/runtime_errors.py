"""A failed runtime CLI call, sorted by its message.

The only text matching about the runtime: its CLI has no structured form of
its errors, so `classify_runtime_error` sorts the CLI's *error messages*
into the few kinds the planner must tell apart.
"""

from __future__ import annotations

from typing import Literal

RuntimeErrorKind = Literal[
    "not_found", "daemon_down", "permission_denied", "not_installed", "other"
]


def classify_runtime_error(stderr: str, exit_status: int | None = None) -> RuntimeErrorKind:
    """Sort a failed runtime CLI call by its message (the CLI has no structured errors)."""
    low = stderr.lower()
    if "no such object" in low or "no such container" in low or "no such image" in low:
        return "not_found"
    if "permission denied" in low and "docker" in low:
        return "permission_denied"
    if "cannot connect to the docker daemon" in low or "is the docker daemon running" in low:
        return "daemon_down"
    if "error during connect" in low or "connection refused" in low:
        return "daemon_down"
    if exit_status == 127 or "command not found" in low or "docker: not found" in low:
        return "not_installed"
    return "other"
