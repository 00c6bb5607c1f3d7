"""`cvs validate`: load and check the cluster file; connects nowhere."""

from __future__ import annotations

import argparse
import sys

import yaml

from orchestrator.cli.common import cluster_path, load, write_json_result
from orchestrator.config import cluster_warnings, cvs_import_notes, normalized_cluster
from orchestrator.config.loader import RUN_TIME_HOST
from orchestrator.config.slurm import SlurmOutsideJob
from orchestrator.errors import ExitCode
from orchestrator.limits.resources import cluster_effective_resources

SLURM_AT_RUN_TIME = (
    "hosts come from the running Slurm job at run time (cvs inside salloc or an sbatch "
    "script); outside a job the rest of the file was checked"
)


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        cluster = load(args, check_files=not args.no_check_files)
        at_run_time = False
    except SlurmOutsideJob:
        # Outside a job the hosts of `hosts: {from: slurm}` are not known yet:
        # check the rest, and say where the hosts will come from.
        cluster = load(args, check_files=not args.no_check_files, hosts_at_run_time=True)
        at_run_time = True
    # A value that loads but that docker would refuse (cpus 0.001, memory 1Ki)
    # raises ResourceError, a ConfigError: exit 2 naming the key.
    cluster_effective_resources(cluster)
    doc = normalized_cluster(cluster)
    warnings = cluster_warnings(cluster)
    notes = cvs_import_notes(cluster)
    if at_run_time:
        doc["hosts"] = {"from": "slurm"}
        if doc.get("head") == RUN_TIME_HOST["name"]:
            doc.pop("head")
        notes = [*notes, SLURM_AT_RUN_TIME]
    if args.json:
        write_json_result(
            args, ok=True, exit_code=ExitCode.OK, cluster=doc, warnings=warnings, notes=notes
        )
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
        for w in warnings:
            sys.stderr.write(f"warning: {w}\n")
        for n in notes:
            sys.stderr.write(f"note: {n}\n")
        count = "hosts from the Slurm job" if at_run_time else f"{len(cluster.hosts)} hosts"
        sys.stderr.write(f"{cluster_path(args)}: ok, {count}\n")
    return ExitCode.OK
