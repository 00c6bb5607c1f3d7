"""A real headless browser for tests: Playwright driving Debian's `chromium`.

Playwright's own browser download cannot be reached from these machines, so
it is pointed at the system binary (`.ci/bootstrap` installs both).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def browser_skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs playwright (pip install -e '.[test]')"
    if chromium_path() is None:
        return "needs Debian's chromium (apt-get install chromium)"
    return None


@dataclass
class PageVisit:
    page: Any
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    # Every URL the page asked for (the file itself, and nothing else if self-contained).
    requests: list[str] = field(default_factory=list)


@contextmanager
def open_page(path: Path, *, width: int = 1280, height: int = 900) -> Iterator[PageVisit]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            visit = PageVisit(page)
            page.on(
                "console",
                lambda m: visit.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: visit.page_errors.append(str(e)))
            page.on("request", lambda r: visit.requests.append(r.url))
            page.goto(path.resolve().as_uri())
            page.wait_for_load_state("load")
            yield visit
        finally:
            browser.close()
