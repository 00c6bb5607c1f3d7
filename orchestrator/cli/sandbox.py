"""`cvs sandbox up|down`: a local multi-host cluster on this machine."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from orchestrator.cli.common import DEFAULT_SANDBOX_DIR, write_json_result
from orchestrator.errors import ExitCode, UsageError
from orchestrator.sandbox import SandboxError, sandbox_down, sandbox_up


def cmd_sandbox(args: argparse.Namespace) -> int:
    directory = Path(args.dir or os.environ.get("CVS_SANDBOX_DIR") or DEFAULT_SANDBOX_DIR)

    def progress(text: str) -> None:
        if not args.json:
            sys.stderr.write(f"sandbox: {text}\n")
            sys.stderr.flush()

    try:
        if args.sandbox_command == "up":
            if args.hosts < 1:
                raise UsageError("cvs sandbox up: --hosts must be at least 1")
            if args.rootless and args.runtime != "podman":
                raise UsageError(
                    "cvs sandbox up: --rootless is rootless podman; add --runtime podman"
                )
            if args.egress and args.runtime != "docker":
                raise UsageError(
                    "cvs sandbox up: the --egress host runs docker only; leave out --egress "
                    "or --runtime podman"
                )
            if args.gpus < 0 or args.gpus > 16:
                raise UsageError("cvs sandbox up: --gpus must be between 0 and 16")
            if args.lifetime == "per_job" and not args.slurm:
                raise UsageError(
                    "cvs sandbox up: --lifetime per_job keeps containers until their Slurm job "
                    "ends; add --slurm"
                )
            if args.slurm and args.egress:
                raise UsageError(
                    "cvs sandbox up: the --egress host is not a Slurm node; leave out --egress "
                    "or --slurm"
                )
            box = sandbox_up(
                directory,
                args.hosts,
                egress_host=args.egress,
                progress=progress,
                runtime=args.runtime,
                rootless=args.rootless,
                mpi=args.mpi,
                slurm=args.slurm,
                gpus=args.gpus,
                registry=args.registry,
                registry_rate=args.registry_rate,
            )
            if args.lifetime != "per_run":
                _set_sandbox_lifetime(box.cluster_file, args.lifetime)
            if args.json:
                write_json_result(
                    args,
                    ok=True,
                    exit_code=ExitCode.OK,
                    cluster=str(box.cluster_file),
                    **({"slurm_env": str(box.slurm_env_file)} if box.slurm else {}),
                    **({"registry_env": str(box.registry_env_file)} if box.netns_registry else {}),
                )
            else:
                sys.stdout.write(f"{box.cluster_file}\n")
        else:
            sandbox_down(directory, progress=progress)
            if args.json:
                write_json_result(args, ok=True, exit_code=ExitCode.OK)
    except SandboxError as exc:
        sys.stderr.write(f"cvs sandbox: {exc}\n")
        if args.json:
            write_json_result(args, ok=False, exit_code=ExitCode.USAGE, error=str(exc))
        return ExitCode.USAGE
    return ExitCode.OK


def _set_sandbox_lifetime(path: Path, lifetime: str) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["container"]["lifetime"] = lifetime
    header = "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#"))
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
