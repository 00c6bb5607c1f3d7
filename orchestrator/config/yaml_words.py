"""PURE: a YAML structure error in the words a person uses, at the line where
the structure broke.

PyYAML reports where its parser noticed, in its own terms: `expected <block
end>, but found '<block mapping start>' (while parsing a block mapping at line
9)`, where the mistake was an indentation on line 56 and line 9 is `name:`.
`explain` looks at the text around that point and says what is wrong with
which line, for the common mistakes: a tab, a missing space after a colon, a
line indented to no key's level (or under a key that already has a value), a
bracket or quote never closed. Anything else keeps PyYAML's words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# `key:value` where `key: value` was meant (not a URL, not `a::b`, not a time).
_NO_SPACE = re.compile(r"^\s*(?:-\s+)?([A-Za-z_][\w.-]*):([^\s:/][^\n]*)$")


@dataclass(frozen=True)
class Explained:
    """Where a YAML error really is and what to say about it."""

    line: int  # 1-based: the line the user should look at
    column: int  # 1-based
    message: str


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _content(lines: list[str], index: int) -> bool:
    stripped = lines[index].strip() if 0 <= index < len(lines) else ""
    return bool(stripped) and not stripped.startswith("#")


def _previous(lines: list[str], index: int) -> int | None:
    """The index of the nearest line above `index` with content."""
    for i in range(index - 1, -1, -1):
        if _content(lines, i):
            return i
    return None


def _opens_block(line: str) -> bool:
    """`key:` (maybe with a comment, an anchor or a `- ` in front): a block follows."""
    text = re.sub(r"\s+#.*$", "", line).rstrip()
    return bool(re.match(r"^\s*(?:-\s+)?[^\s#][^:]*:(?:\s+&\S+)?$", text)) or text.strip() == "-"


def _levels(lines: list[str], index: int) -> list[tuple[int, str]]:
    """The indentation levels a line at `index` could take: each enclosing key's
    (walking up, each one less indented than the last), with its key."""
    levels: list[tuple[int, str]] = []
    limit: int | None = None
    for i in range(index - 1, -1, -1):
        if not _content(lines, i):
            continue
        indent = _indent(lines[i])
        if limit is None or indent < limit:
            key = lines[i].strip().lstrip("- ").split(":", 1)[0]
            levels.append((indent, key))
            limit = indent
            if indent == 0:
                break
    return levels


def _is_item(line: str) -> bool:
    stripped = line.strip()
    return stripped == "-" or stripped.startswith("- ")


def _sibling_item(lines: list[str], index: int) -> int | None:
    """The list item above a list item at `index`: the nearest line above that
    is one, unless a key less indented than both comes first (another block)."""
    here = _indent(lines[index])
    for i in range(index - 1, -1, -1):
        if not _content(lines, i):
            continue
        if _is_item(lines[i]):
            return i
        if _indent(lines[i]) < here and _indent(lines[i]) == 0:
            return None
    return None


def _indentation(lines: list[str], index: int) -> str:
    here = _indent(lines[index])
    if _is_item(lines[index]):
        # A list item goes with the items of its list: the advice names them,
        # not the keys inside the item above.
        sibling = _sibling_item(lines, index)
        if sibling is not None and _indent(lines[sibling]) != here:
            return (
                f"this list item is indented {here} spaces, unlike the list it is in: "
                f"indent it {_indent(lines[sibling])} spaces, like the item on line "
                f"{sibling + 1} ({lines[sibling].strip()!r})"
            )
    prev = _previous(lines, index)
    if prev is not None and here > _indent(lines[prev]) and not _opens_block(lines[prev]):
        return (
            f"this line is indented under nothing: line {prev + 1} "
            f"({lines[prev].strip()!r}) already has a value, so no key can be nested under it; "
            f"indent it like line {prev + 1} ({_indent(lines[prev])} spaces) to make it a "
            "key next to it"
        )
    choices = ", ".join(f"{n} to go with {key!r}" for n, key in _levels(lines, index))
    return (
        f"this line is indented {here} spaces, which lines up with no key above it: "
        f"indent it {choices}"
    )


def explain(
    text: str,
    problem: str,
    line: int,
    column: int,
    context: str | None,
    context_line: int | None,
    context_column: int | None = None,
) -> Explained | None:
    """What went wrong, for PyYAML's `problem` at 1-based `line`/`column` (and
    its `context` at `context_line`); None when it is not a mistake known here."""
    lines = text.splitlines()
    index = line - 1
    problem_l = problem.lower()
    if "'\\t'" in problem or "\\t" in problem_l or "found character '\t'" in problem:
        return Explained(
            line,
            column,
            "a tab indents this line: YAML indents with spaces only (replace the tab with spaces)",
        )
    for i in (index, _previous(lines, index)):
        if i is None or not 0 <= i < len(lines):
            continue
        m = _NO_SPACE.match(lines[i])
        if m and ("mapping values" in problem_l or "could not find expected ':'" in problem_l):
            fixed = f"{m.group(1)}: {m.group(2)}"
            return Explained(
                i + 1,
                lines[i].index(":") + 1,
                f"no space after the colon: YAML reads {m.group(0).strip()!r} as one word; "
                f"write {fixed!r}",
            )
    if context and ("flow sequence" in context or "flow mapping" in context):
        opened = "[" if "sequence" in context else "{"
        closing = "]" if opened == "[" else "}"
        where = context_line or line
        return Explained(
            where,
            column if context_column is None else context_column,
            f"the {opened!r} opened on this line is never closed: end it with {closing!r}",
        )
    if context and "quoted scalar" in context:
        return Explained(
            context_line or line,
            context_column or column,
            "the quote opened on this line is never closed: close it on the same line",
        )
    if 0 <= index < len(lines) and (
        "expected <block end>" in problem_l or "mapping values are not allowed" in problem_l
    ):
        if "mapping values" in problem_l and lines[index].count(": ") >= 2:
            return Explained(
                line,
                column,
                "a second ': ' on one line: quote the value if it contains ': '",
            )
        return Explained(line, _indent(lines[index]) + 1, _indentation(lines, index))
    return None


def shown(text: str, line: int, width: int = 60) -> str:
    """The line as it is written (tabs visible), cut to `width` characters."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return ""
    raw = lines[line - 1].replace("\t", "\\t").rstrip()
    return raw if len(raw) <= width else raw[: width - 3] + "..."
