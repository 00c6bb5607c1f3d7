"""The garbage collector, tuned for a coordinator process.

Why: every SSH connection is a web of objects with reference cycles
(asyncssh's connection, channels, loggers, the event loop's handles), and a
fan-out allocates them by the hundred thousand. CPython's default thresholds
(700, 10, 10) then run a young-generation collection every 700 allocations and
a full one, which walks every live object, each time the survivors grow by a
quarter: at 3000 hosts the collector took 3.4 s of the coordinator's 7.3 s of
CPU (bench, docs/design.md "Fleet scale"), and its share grows with the fleet.

Start-up allocates what lives as long as the process (modules, classes, the
argument parser): a collection then frees nothing and walks everything, and
with the default thresholds the imports of `cvs exec` ran dozens of them,
about 15 % of its start-up CPU. So `start()` turns the collector off from the
process's first line, and `tune()` turns it back on.

A handler that connects imports most of what it needs when it runs (asyncssh,
the API, the event loop's backend: lazily, so that the commands that connect
nowhere never pay for them). Run after `tune()`, those imports allocated
enough for two young collections (10-13 ms of `cvs exec`'s CPU, walking
objects that live as long as the process) and stayed out of the frozen heap.
So a handler names them (`imports_first`) and the entry point imports them
before `tune()`.

`tune()` freezes what is alive after start-up (modules, classes, the
argument parser: permanent, never scanned again) and makes young collections rarer.
Cyclic garbage is still collected, later and in bigger batches; memory stays
bounded by the same rule as before (a collection per N allocations), with N
larger. This is the process's own setting: the CLI calls it, the library never
does (a Python caller's process is theirs to tune).
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable
from typing import TypeVar

_F = TypeVar("_F", bound=Callable[..., object])

# Young-generation threshold: allocations (minus deallocations) between
# collections. 20 000 cut the collector's time at 3000 hosts from 3.4 s to
# 0.6-0.8 s; the older generations keep CPython's ratios.
YOUNG_THRESHOLD = 20_000


def start() -> None:
    """No collection during start-up (until `tune()`, which the CLI calls before
    the command runs)."""
    gc.disable()


def imports_first(*modules: str) -> Callable[[_F], _F]:
    """Mark a CLI handler with the modules it imports when it runs: the entry
    point imports them before `tune()` (`import_for`)."""

    def mark(handler: _F) -> _F:
        handler.cvs_imports_first = modules  # type: ignore[attr-defined]
        return handler

    return mark


def import_for(handler: Callable[..., object]) -> None:
    """Import what `handler` names with `imports_first` (nothing if it names none)."""
    for name in getattr(handler, "cvs_imports_first", ()):
        importlib.import_module(name)


def tune() -> None:
    """Freeze the start-up heap, collect the young generation less often, and
    turn the collector (back) on."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    gc.enable()
