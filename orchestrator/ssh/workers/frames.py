"""The frames between the coordinator and its worker processes: one frozen
dataclass per frame, pickled with a length header over the worker's stdin
and stdout (both ends are the same program, so pickle is safe here).

Parent to child: `Init`, then `Fan` (a command per host), `Call` (one
operation of the seam, answered by `Reply` or `Failed`), the held
processes' `Write`, `Eof` and `Signal` (never answered), `Keys`,
`Cancel` and `Close`. Child to parent: `EventFrame` (every event of its
pool), `Result` and `Done` (a fan-out's), `Reply`/`Failed` (a call's) and
`Exited` (a held process's channel closed).

An operation (`Op`) is what `Call` carries; `child.py` matches on its type,
exhaustively (mypy checks that every operation has a handler).
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Literal

from orchestrator.errors import Text
from orchestrator.events import Event
from orchestrator.results import HostResult, Status
from orchestrator.ssh.seam import HeldRequest, Request

if TYPE_CHECKING:
    from orchestrator.config import ClusterConfig
    from orchestrator.ssh.target import ConnectKind, Endpoint, Target

HEADER = struct.Struct("!I")


def encode(frame: Frame) -> bytes:
    data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> Frame:
    frame: Frame = pickle.loads(data)
    return frame


def write_frame(stream: IO[bytes], frame: Frame) -> None:
    stream.write(encode(frame))
    stream.flush()


def read_frame(stream: IO[bytes]) -> Frame | None:
    """The next frame, or None at the end of the stream."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return decode(data)


# -- operations (what a Call asks) ------------------------------------------------


@dataclass(frozen=True)
class RunOp:
    """`SSHPool.send`."""

    host: str
    request: Request


@dataclass(frozen=True)
class HeldOpen:
    """`SSHPool.held_process` (a host's or a container's), held under id
    `hid` until `HeldClose`; answered with the container counters."""

    hid: int
    target: Target
    held: HeldRequest


@dataclass(frozen=True)
class HeldRead:
    hid: int
    stream: Literal["stdout", "stderr"]
    how: Literal["readline", "read"]
    size: int = -1


@dataclass(frozen=True)
class HeldDrain:
    hid: int


@dataclass(frozen=True)
class HeldWait:
    hid: int


@dataclass(frozen=True)
class HeldClose:
    hid: int


@dataclass(frozen=True)
class ContainerRun:
    """`SSHPool.send` to an `Endpoint`, answered with the container counters too."""

    ep: Endpoint
    request: Request


@dataclass(frozen=True)
class ContainerWarm:
    """`SSHPool.warm`."""

    ep: Endpoint


Op = RunOp | HeldOpen | HeldRead | HeldDrain | HeldWait | HeldClose | ContainerRun | ContainerWarm


# -- parent to child ----------------------------------------------------------------


@dataclass(frozen=True)
class Init:
    cluster: ClusterConfig
    output_tail: int
    limit: int  # this worker's share of concurrency.hosts


@dataclass(frozen=True)
class Fan:
    """`requests[host]` on each host, fanned out in the worker."""

    rid: int
    requests: Mapping[str, Request]


@dataclass(frozen=True)
class Call:
    cid: int
    op: Op


@dataclass(frozen=True)
class Write:
    hid: int
    data: str | bytes


@dataclass(frozen=True)
class Eof:
    hid: int


@dataclass(frozen=True)
class Signal:
    hid: int
    name: str


@dataclass(frozen=True)
class Keys:
    """The key the container sshds accept (commands through them start once sent)."""

    private_key: bytes


@dataclass(frozen=True)
class Cancel:
    """Cancel the fan-out or call with this id."""

    id: int


@dataclass(frozen=True)
class Close:
    pass


Post = Write | Eof | Signal
ToChild = Init | Fan | Call | Write | Eof | Signal | Keys | Cancel | Close


# -- child to parent ----------------------------------------------------------------


@dataclass(frozen=True)
class EventFrame:
    event: Event


@dataclass(frozen=True)
class Result:
    rid: int
    result: HostResult


@dataclass(frozen=True)
class Done:
    rid: int
    stats: Mapping[str, int]


@dataclass(frozen=True)
class Exited:
    """A held process's channel closed (its exit status)."""

    hid: int
    status: int | None


@dataclass(frozen=True)
class Reply:
    cid: int
    value: object


@dataclass(frozen=True)
class ConnectFailed:
    """The call raised ConnectError."""

    host: str
    status: Status
    message: str
    attempts: int


@dataclass(frozen=True)
class NotStartedFailed:
    """The call raised target.NotStarted."""

    host: str
    kind: ConnectKind
    reason: Text


@dataclass(frozen=True)
class Failed:
    cid: int
    error: ConnectFailed | NotStartedFailed | str


ToParent = EventFrame | Result | Done | Exited | Reply | Failed

Frame = ToChild | ToParent
