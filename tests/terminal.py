"""A private tmux server for tests that need a real terminal (a pty)."""

from __future__ import annotations

import subprocess
import time


class Tmux:
    """A private tmux server (its own socket): nothing else's sessions are touched."""

    def __init__(self, name: str) -> None:
        self.socket = name

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        return proc.stdout

    def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self("capture-pane", "-p", "-t", "t")
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on screen:\n{screen}")
