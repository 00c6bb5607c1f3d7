"""`cvs slurm epilog`: the Slurm epilog cvs ships, printed or installed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator import remote
from orchestrator.cli.common import write_json_result
from orchestrator.errors import ExitCode, UsageError


def epilog_text() -> str:
    """remote/slurm_epilog.sh as shipped (comments and all)."""
    return remote.source("slurm_epilog")


def cmd_slurm(args: argparse.Namespace) -> int:
    text = epilog_text()
    if args.install is None:
        if args.json:  # one result line; the script is its `epilog` field
            write_json_result(args, ok=True, exit_code=ExitCode.OK, epilog=text)
        else:
            sys.stdout.write(text)
        return ExitCode.OK
    path = Path(args.install)
    if path.is_dir():
        raise UsageError(f"cvs slurm epilog --install {path}: is a directory; name the file")
    if not path.parent.is_dir():
        raise UsageError(f"cvs slurm epilog --install {path}: {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.cvs-tmp")
    try:
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"cvs slurm epilog --install {path}: {exc.strerror or exc}") from None
    if args.json:
        write_json_result(args, ok=True, exit_code=ExitCode.OK, installed=str(path))
    sys.stderr.write(
        f"cvs: installed {path}; point slurm.conf at it (Epilog={path}, or call it from the "
        "site's epilog) on every node\n"
    )
    return ExitCode.OK
