"""PURE: error text as a person reads it in a summary, and the key it folds by.

docs/cli-output.md promises one line per distinct error, hosts folded
(`node[1-3] (3): run: ...`). Two errors are "the same" when they differ only
in what is per host by nature:

- the host's own name and addresses (asyncssh says `... on host 10.0.0.1`);
- container and image IDs (each host's container has its own 64-hex ID);

and docker's usage hints (`See 'docker run --help'.`) are noise in both.
`fold_key` is what errors are compared by; `short_text` is what is shown:
the same cleaning, with IDs abbreviated to docker's 12 characters instead of
masked and the host named where the line is about one host. The full text
stays where it was (the run's logs, `--json`'s per-host results).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

HOST_MARK = "<host>"
ID_MARK = "<id>"

# docker and podman end many errors with where to read more; it says nothing
# about this failure, and differs by subcommand.
_USAGE_HINT = re.compile(
    r"\s*(?:See|Run) '(?:docker|podman)(?: [\w-]+)* --help'(?: for more information)?\.?",
    re.IGNORECASE,
)
# A full container/image ID (optionally `sha256:`-prefixed): 64 hex digits.
_FULL_ID = re.compile(r"\b(?:sha256:)?([0-9a-f]{12})[0-9a-f]{52}\b")
_SHORT_ID = re.compile(r"\b(?:sha256:)?[0-9a-f]{12}\b")


def _one_line(text: str) -> str:
    return " ".join(_USAGE_HINT.sub("", text).split())


def _name_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    # Longest first: `node10` before `node1`. Not inside a longer word or
    # address (`node1` in `node10`, `10.0.0.1` in `10.0.0.12`).
    unique = sorted({n for n in names if n}, key=len, reverse=True)
    if not unique:
        return None
    alternatives = "|".join(re.escape(n) for n in unique)
    return re.compile(rf"(?<![\w.-])(?:{alternatives})(?![\w-]|\.\w)")


def short_text(text: str, names: Sequence[str] = ()) -> str:
    """`text` on one line, usage hints dropped, full IDs abbreviated to 12
    characters; `names` (the host's name and addresses) replaced by `<host>`."""
    line = _FULL_ID.sub(lambda m: m.group(1), _one_line(text))
    # Only the names the line holds: most errors name none, and a pattern
    # compiled per host (5000 distinct ones) never hits re's cache.
    pattern = _name_pattern(n for n in names if n and n in line)
    return pattern.sub(HOST_MARK, line) if pattern else line


def fold_key(text: str, names: Sequence[str] = ()) -> str:
    """What two hosts' errors are compared by: `short_text` with IDs masked."""
    return _SHORT_ID.sub(ID_MARK, short_text(text, names))


def fold_errors(
    errors: Mapping[str, str], aliases: Mapping[str, Sequence[str]] | None = None
) -> list[tuple[list[str], str]]:
    """Hosts grouped by `fold_key` of their error, largest group first, each with
    the text to show: for one host, its error with its names kept; for
    several, the cleaned text (with the IDs abbreviated when the hosts share
    them, masked when they differ)."""
    aliases = aliases or {}
    groups: dict[str, list[str]] = {}
    shown: dict[str, set[str]] = {}
    for host, error in errors.items():
        names = [host, *aliases.get(host, ())]
        key = fold_key(error, names)
        groups.setdefault(key, []).append(host)
        shown.setdefault(key, set()).add(short_text(error, names))
    out: list[tuple[list[str], str]] = []
    for key, hosts in groups.items():
        if len(hosts) == 1:
            text = short_text(errors[hosts[0]])
        else:
            texts = shown[key]
            text = next(iter(texts)) if len(texts) == 1 else key
        out.append((hosts, text))
    return sorted(out, key=lambda g: -len(g[0]))


class SeenErrors:
    """The live view's memory of errors already shown: the first host with an
    error gets the whole (cleaned) line, the next ones a pointer to it
    (`node2 ! run: the same error as node1`), so one error on 3 hosts is not
    printed 3 times before the summary folds it. Bounded: one entry per
    distinct error, at most `limit` of them."""

    def __init__(self, aliases: Mapping[str, Sequence[str]] | None = None, limit: int = 1000):
        self.aliases = aliases or {}
        self.limit = limit
        self._first: dict[str, str] = {}

    def line(self, host: str, text: str, context: str = "") -> str:
        """What to print for `host`'s error `text` (`context`, e.g. the step,
        is part of what makes two errors the same, but is not printed)."""
        names = [host, *self.aliases.get(host, ())]
        key = f"{context}\0{fold_key(text, names)}"
        first = self._first.get(key)
        if first is not None and first != host:
            return f"the same error as {first}"
        if len(self._first) < self.limit:
            self._first.setdefault(key, host)
        return short_text(text)
