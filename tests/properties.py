"""How many examples a property test tries, by Hypothesis profile.

`.ci/test` runs the suite under the `ci` profile: each property test tries as
many examples as it names, and 100 (Hypothesis's default) where it names none.
Elsewhere (the fast subset a developer runs, `pytest -m "not sandbox"`) the
`dev` profile tries a fifth of that: the same properties over fewer generated
inputs, so the fast subset stays under a minute while CI still checks as deeply
as before. conftest registers both profiles and loads the one the
HYPOTHESIS_PROFILE variable names (`dev` when unset); `--hypothesis-profile`
also works, as it is loaded before any test module is imported.
"""

from __future__ import annotations

from hypothesis import settings

CI = "ci"
DEV = "dev"
# The dev profile's share of each test's CI count, and its floor: a property
# still sees a handful of shapes (hypothesis also replays its saved failures).
DEV_DIVISOR = 5
DEV_FLOOR = 10


def examples(ci_count: int) -> int:
    """`ci_count` under the ci profile, a fifth of it (at least 10) otherwise."""
    if settings.get_current_profile_name() == CI:
        return ci_count
    return _dev_count(ci_count)


def _dev_count(ci_count: int) -> int:
    return max(DEV_FLOOR, ci_count // DEV_DIVISOR)


def load_profile(name: str) -> None:
    """Registers ci and dev (their counts for tests that name none) and loads `name`."""
    settings.register_profile(CI, max_examples=100)
    settings.register_profile(DEV, max_examples=_dev_count(100))
    settings.load_profile(name)
