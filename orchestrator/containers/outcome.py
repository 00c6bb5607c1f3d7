"""What `up` did, as data: each host's outcome (the steps run, the state it
ended in) and the report over all hosts, with their words (`summary`,
`error`, `to_dict`). The renderers (console, `--json`, `UpFailed`) read
these, never an error's text (docs/design.md, "Outcomes are data").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.config.hostlist import abbreviate_hosts
from orchestrator.containers.plan.model import HostAction, Plan
from orchestrator.errors import ExitCode, Phrase, Text, first_line
from orchestrator.results import HostResult

# What a host ended as after `up`: the renderers read this, never the error text.
#   ready        its container is there and ready
#   failed       one of its own steps failed (`error` says which and why)
#   rolled_back  its own steps passed, but a rollback removed what it started
#                because another host failed (`rolled_back` says why)
#   not_started  nothing was started here because another host's preparation
#                failed (a start goes everywhere or nowhere)
OutcomeState = Literal["ready", "failed", "rolled_back", "not_started"]


@dataclass
class HostOutcome:
    """What `up` did on one host: the steps run and the state it ended in."""

    host: str
    action: HostAction
    steps: list[tuple[str, HostResult]] = field(default_factory=list)
    state: OutcomeState = "ready"
    error: Text | None = None
    unreachable: bool = False
    # What `docker run -d` printed: the container this attempt made here.
    container_id: str | None = None
    # Why a rollback removed what this host's pipeline had started (a later
    # step elsewhere undid it): the host is then not ready, whatever its
    # own steps said. Set on a failed host too (its state stays failed).
    rolled_back: Text | None = None
    # Why nothing was started here (`hold_back`): kept apart from `error`,
    # which says it after "not started: ", so `summary` need not take it apart.
    held_back: str | None = None

    @property
    def ok(self) -> bool:
        """Ready: the container is there and nothing undid it."""
        return self.state == "ready"

    def fail(self, step: str, result: HostResult | None, message: Text) -> None:
        self.state = "failed"
        self.unreachable = result is not None and not result.reached
        tail = result.tail(15) if result is not None else ""
        self.error = Phrase(f"{step}: ", message, f"\n{tail}" if tail else "")

    def roll_back(self, why: Text) -> None:
        """The container this host started was removed again: not ready.

        A host that failed on its own keeps its state and error (`summary`
        adds that it was rolled back); one whose own steps all passed is now
        rolled_back and says why.
        """
        self.rolled_back = why
        if self.state == "ready":
            self.state = "rolled_back"
            self.error = Phrase("rolled back: ", why)

    def hold_back(self, why: str) -> None:
        """Nothing was started here because another host's preparation failed
        (a start goes everywhere or nowhere): not ready, and says why."""
        if self.state == "ready":
            self.state = "not_started"
            self.held_back = why
            self.error = Phrase("not started: ", why)

    @property
    def summary(self) -> Text:
        """One line: what the host ended as (`cold_start ok (pull, run)`,
        `cold_start ROLLED BACK: ...`, `cold_start FAILED at run: ...`)."""
        kind = self.action.kind
        if self.state == "ready":
            return f"{kind} ok ({', '.join(name for name, _ in self.steps) or 'nothing to do'})"
        if self.state == "rolled_back":
            return Phrase(f"{kind} ROLLED BACK: ", self.rolled_back or "")
        if self.state == "not_started" and self.held_back is not None:
            return Phrase(f"{kind} NOT STARTED: ", first_line(self.held_back))
        first = first_line(self.error or "failed")
        removed = " (rolled back)" if self.rolled_back is not None else ""
        return Phrase(f"{kind} FAILED at ", first, removed)


@dataclass
class UpReport:
    plan: Plan
    outcomes: dict[str, HostOutcome]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes.values())

    @property
    def ready(self) -> list[str]:
        """Hosts whose container is there and ready now (not failed, not rolled back)."""
        return [h for h, o in self.outcomes.items() if o.ok]

    @property
    def error(self) -> Text | None:
        """One line for the whole `up` when some host is not ready, else None."""
        failed = {h: o for h, o in self.outcomes.items() if not o.ok}
        if not failed:
            return None
        own = {h: o for h, o in failed.items() if o.state != "rolled_back"}
        first_host, first = next(iter((own or failed).items()))
        detail = first_line(first.error or "failed")
        rolled = [h for h, o in failed.items() if o.state == "rolled_back"]
        others = len(own) - 1
        return Phrase(
            f"up: {len(self.ready)}/{len(self.outcomes)} hosts ready; {first_host}: ",
            detail,
            f"; rolled back on {', '.join(rolled)}" if rolled else "",
            f" (and {others} more failed host(s))" if others > 0 else "",
        )

    @property
    def exit_code(self) -> ExitCode:
        if any(o.unreachable for o in self.outcomes.values()):
            return ExitCode.UNREACHABLE
        return ExitCode.OK if self.ok else ExitCode.FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "lifetime": self.plan.lifetime,
            "warnings": self.plan.warnings,
            "error": self.error,
            "ready": len(self.ready),
            "hosts": {
                h: {
                    "action": o.action.kind,
                    "reason": o.action.reason,
                    "ok": o.ok,
                    "state": o.state,
                    "error": o.error,
                    "rolled_back": o.rolled_back,
                    "steps": {name: r.status for name, r in o.steps},
                }
                for h, o in self.outcomes.items()
            },
        }


def changed_so_far(
    image: str, launching: Sequence[str], outcomes: Mapping[str, HostOutcome]
) -> list[str]:
    """What the prepare step changed before a barrier refusal (`login to the
    registry on h1`, `image X pulled on node[1-2]`): the refusal must not say
    nothing changed. No container was started by then."""
    out = []
    for step, what in (
        ("login", "login to the registry"),
        ("pull", f"image {image} pulled"),
        ("load", f"image {image} loaded"),
    ):
        done = [h for h in launching if any(s == step and r.ok for s, r in outcomes[h].steps)]
        if done:
            out.append(f"{what} on {abbreviate_hosts(done)} (left in place)")
    return out


def run_failed(outcome: HostOutcome) -> bool:
    return any(
        s in ("pull", "load", "login", "run", "image", "remove")
        for s, r in outcome.steps
        if not r.ok
    )
