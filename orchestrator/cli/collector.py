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

`tune()` freezes what is alive after start-up (modules, classes, the
argument parser: permanent, never scanned again) and makes young collections rarer.
Cyclic garbage is still collected, later and in bigger batches; memory stays
bounded by the same rule as before (a collection per N allocations), with N
larger. This is the process's own setting: the CLI calls it, the library never
does (a Python caller's process is theirs to tune).
"""

from __future__ import annotations

import gc

# Young-generation threshold: allocations (minus deallocations) between
# collections. 20 000 cut the collector's time at 3000 hosts from 3.4 s to
# 0.6-0.8 s; the older generations keep CPython's ratios.
YOUNG_THRESHOLD = 20_000


def start() -> None:
    """No collection during start-up (until `tune()`, which the CLI calls before
    the command runs)."""
    gc.disable()


def tune() -> None:
    """Freeze the start-up heap, collect the young generation less often, and
    turn the collector (back) on."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    gc.enable()
