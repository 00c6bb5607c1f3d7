"""The README's shell blocks, run as written (issue 36): the five-minute tour
builds its own sandbox with `cvs sandbox up`, so this test runs it verbatim in
an empty temporary directory (its `./sandbox` and `./runs` land there) with
this checkout's `cvs` first on PATH, and removes the sandbox afterwards, also
on failure. Blocks marked `<!-- not-run: REASON -->` are left out
(tests/test_docs.py checks each says why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import cvs
from conftest import _skip_reason
from doctools import runnable_readme_blocks

BLOCKS = runnable_readme_blocks()


@pytest.mark.sandbox
@pytest.mark.parametrize(("line", "body"), BLOCKS, ids=[f"README.md:{n}" for n, _ in BLOCKS])
def test_readme_shell_block_runs_as_written(line: int, body: str, tmp_path: Path) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "CI": "1",
    }
    env.pop("CVS_CLUSTER", None)
    try:
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out.returncode == 0, (
            f"README.md:{line} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    finally:
        if (tmp_path / "sandbox").exists():
            cvs("sandbox", "down", "--dir", "sandbox", cwd=tmp_path, timeout=300)
    if "cvs run test_demo" in body:
        assert len(list((tmp_path / "runs").iterdir())) == 2, "install_demo and test_demo"
