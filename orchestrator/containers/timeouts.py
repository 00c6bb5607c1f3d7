"""The bounds of `up`'s and `down`'s steps on a host, and the words for each
when it stops one: the start budget the image steps share
(`container.start_timeout`) and a runtime call given up on
(`container.runtime_timeout`), each naming the setting that raises it.
"""

from __future__ import annotations

import time

from orchestrator.config import ContainerConfig
from orchestrator.remote.runtime import runtime_hung


class StartBudget:
    """What is left of `container.start_timeout` for one host's image steps:
    login, load and pull share it (docs/design.md), so a stalled login cannot
    add its own wait to the pull's."""

    def __init__(self, seconds: float, covers: str) -> None:
        self.deadline = time.monotonic() + seconds
        self.covers = covers  # the steps it bounds, for the message

    def left(self) -> float:
        # A step that starts with nothing left still gets a moment to fail
        # on its own instead of a zero timeout that reads as a hang.
        return max(0.5, self.deadline - time.monotonic())


def runtime_gave_up(cfg: ContainerConfig, what: str) -> str:
    """Why a runtime call was given up on: the runtime (docker or podman),
    the bound, its name, the suspect."""
    return runtime_hung(cfg.runtime, cfg.runtime_timeout, what) + "; stopped"


def timeout_message(
    cfg: ContainerConfig, step: str, budget: StartBudget | None, timeout: float
) -> str:
    """Which bound stopped `step`, and the setting that raises it."""
    if budget is not None:
        shared = f", for {budget.covers} together" if " and " in budget.covers else ""
        return (
            f"{step} did not finish within container.start_timeout "
            f"({cfg.start_timeout:g}s{shared}): stopped, nothing started on this host"
        )
    if timeout == cfg.start_timeout:
        return (
            f"{step} did not finish within container.start_timeout "
            f"({cfg.start_timeout:g}s): stopped, nothing started on this host"
        )
    if timeout == cfg.runtime_timeout:
        return runtime_gave_up(cfg, step)
    return f"{step} did not finish within {timeout:g}s: stopped"
