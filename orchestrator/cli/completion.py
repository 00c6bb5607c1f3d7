"""`cvs completion bash|zsh`: the completion script, generated from the parser by shtab."""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli.parser import build_parser
from orchestrator.errors import ExitCode, UsageError


def completion_script(shell: str) -> str:
    try:
        import shtab
    except ImportError:  # a dependency, but say so plainly if it went missing
        raise UsageError("cvs completion: needs the shtab package (pip install shtab)") from None
    return str(shtab.complete(build_parser(), shell=shell))


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(args.shell))
    return ExitCode.OK
