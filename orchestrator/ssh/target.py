"""Where a command runs: a host (its name) or a container's sshd (`Endpoint`).

The seam (ssh/seam.py) takes either; `SSHPool` holds the connections to
both (ssh/transport.py, ssh/container_channel.py). What a container's
endpoint is, and when to use it, is decided above (containers/route.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from orchestrator.errors import Text

# Why a container's sshd could not be used.
ConnectKind = Literal["refused", "timeout", "host_key", "auth", "host", "protocol"]


@dataclass(frozen=True)
class Endpoint:
    """One container's sshd as reached from its host (all of it checked by the caller)."""

    host: str  # the cluster's name for the host
    address: str  # as the host sees it (127.0.0.1 with host networking)
    port: int
    username: str  # root, or the image's user
    host_key: str  # `ssh-ed25519 AAAA...`: the only key accepted
    # What the connection was opened to (for messages); not compared: a
    # connection opened before the probe named the container serves it.
    container_id: str = field(default="", compare=False)


# A host by its name in the cluster file, or a container's sshd.
Target = str | Endpoint


def host_of(target: Target) -> str:
    """The host a target is on (itself, or the container's host)."""
    return target if isinstance(target, str) else target.host


class NotStarted(Exception):
    """A command for an `Endpoint` did not start: no connection to the sshd,
    or no channel on it (the caller may take another way)."""

    def __init__(self, host: str, kind: ConnectKind, reason: Text) -> None:
        super().__init__(reason)
        self.host = host
        self.kind = kind
        self.reason = reason


@dataclass
class Counters:
    """What the container connections did (for the leak tests and the benchmark)."""

    connects: int = 0  # handshakes that succeeded
    channels: int = 0  # command channels opened
    open_channels: int = 0  # command channels open right now
    closed_links: int = 0  # connections found closed and dropped
    failures: dict[str, int] = field(default_factory=dict)  # by ConnectKind

    def __add__(self, other: Counters) -> Counters:
        failures = dict(self.failures)
        for kind, n in other.failures.items():
            failures[kind] = failures.get(kind, 0) + n
        return Counters(
            self.connects + other.connects,
            self.channels + other.channels,
            self.open_channels + other.open_channels,
            self.closed_links + other.closed_links,
            failures,
        )
