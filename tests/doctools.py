"""What tests/test_docs.py and tests/test_readme_sandbox.py share: the fenced
blocks of a Markdown page, and which of the README's shell blocks run.

A block preceded by `<!-- not-run: REASON -->` (README shell blocks) or
`<!-- not-validated: REASON -->` (YAML examples) is exempt, with the reason
written where the reader sees it. Every other README shell block is run
verbatim by tests/test_readme_sandbox.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
NOT_RUN = re.compile(r"<!-- not-run: (?P<reason>[^>]+) -->\s*$")
NOT_VALIDATED = re.compile(r"<!-- not-validated: (?P<reason>[^>]+) -->\s*$")


def fenced_blocks(text: str, lang: str) -> list[tuple[int, str, str]]:
    """(line of the fence, the last non-blank line before it, body) of every ```lang block."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == f"```{lang}":
            start = i
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            before = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
            blocks.append((start + 1, before, "\n".join(lines[start + 1 : j]) + "\n"))
            i = j
        i += 1
    return blocks


def readme_shell_blocks() -> list[tuple[int, str, str]]:
    return fenced_blocks(README.read_text(), "sh")


def runnable_readme_blocks() -> list[tuple[int, str]]:
    """(line, body) of each README shell block not marked not-run."""
    return [
        (line, body) for line, before, body in readme_shell_blocks() if not NOT_RUN.search(before)
    ]
