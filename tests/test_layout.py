"""The package's shape: the public API, one error model, a cheap CLI start."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import cvs as run_cvs

import orchestrator
from orchestrator.api import Cluster
from orchestrator.errors import EXIT_CODE_MEANINGS, CvsError, ExitCode
from orchestrator.sync import SyncCluster

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_imports_from_the_package() -> None:
    from orchestrator import (  # noqa: F401  (the import is the test)
        Cluster,
        CvsError,
        ExitCode,
        HostResult,
        HostStatus,
        SyncCluster,
        load_cluster,
    )

    for name in orchestrator.__all__:
        assert getattr(orchestrator, name) is not None, name


def test_importing_the_package_loads_no_dependency() -> None:
    code = (
        "import sys, orchestrator; "
        "print(sorted(m for m in ('asyncssh', 'pydantic', 'rich', 'anyio', 'yaml') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_building_the_cli_parser_loads_no_heavy_dependency() -> None:
    code = (
        "import sys, orchestrator.cli; orchestrator.cli.build_parser(); "
        "print(sorted(m for m in ('asyncssh', 'pydantic', 'rich', 'anyio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _public_members(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def test_sync_cluster_has_every_public_method_of_cluster() -> None:
    missing = set(_public_members(Cluster)) - set(_public_members(SyncCluster))
    assert not missing, f"SyncCluster lacks {sorted(missing)}"
    # `Cluster.config` is a plain attribute; the facade shows it as a property.
    assert isinstance(SyncCluster.config, property)


@pytest.mark.parametrize("name", sorted(n for n in _public_members(Cluster) if n != "open"))
def test_sync_cluster_method_has_the_async_signature(name: str) -> None:
    async_member = getattr(Cluster, name)
    sync_member = getattr(SyncCluster, name)
    if isinstance(async_member, property):
        assert isinstance(sync_member, property), name
        a, s = inspect.signature(async_member.fget), inspect.signature(sync_member.fget)
    else:
        assert inspect.iscoroutinefunction(async_member), name
        assert not inspect.iscoroutinefunction(sync_member), name
        a, s = inspect.signature(async_member), inspect.signature(sync_member)
    assert s == a, f"SyncCluster.{name}{s} != Cluster.{name}{a}"


def test_sync_cluster_opens_like_cluster() -> None:
    a = inspect.signature(Cluster.open)
    s = inspect.signature(SyncCluster.open)
    assert s.parameters == a.parameters


def test_the_package_ships_its_typing_marker() -> None:
    assert (ROOT / "orchestrator" / "py.typed").is_file()


def test_docs_exit_code_table_matches_the_enum() -> None:
    readme = (ROOT / "docs" / "cli.md").read_text()
    section = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\d+)` \| `([A-Z_]+)` \| (.+?) \|$", section, re.MULTILINE)
    assert [(int(code), name) for code, name, _ in rows] == [(c.value, c.name) for c in ExitCode]
    for code, _, meaning in rows:
        assert meaning.startswith(EXIT_CODE_MEANINGS[ExitCode(int(code))]), meaning


def test_cli_help_lists_every_exit_code_with_its_meaning() -> None:
    from orchestrator.cli.parser import build_parser

    epilog = " ".join((build_parser().epilog or "").split())
    listed = " · ".join(f"{code.value} {EXIT_CODE_MEANINGS[code]}" for code in ExitCode)
    assert f"exit codes: {listed}" in epilog


@pytest.mark.parametrize(
    ("module", "name", "code"),
    [
        ("orchestrator.errors", "UsageError", ExitCode.USAGE),
        ("orchestrator.errors", "PolicyRefused", ExitCode.REFUSED),
        ("orchestrator.config", "ConfigError", ExitCode.USAGE),
        ("orchestrator.limits.resources", "ResourceError", ExitCode.USAGE),
        ("orchestrator.api", "HostSelectionError", ExitCode.USAGE),
        ("orchestrator.sandbox.errors", "SandboxError", ExitCode.USAGE),
    ],
)
def test_expected_failures_are_cvs_errors_with_their_exit_code(
    module: str, name: str, code: ExitCode
) -> None:
    import importlib

    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, CvsError)
    assert cls.exit_code is code


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_cli_turns_a_cvs_error_into_one_line_and_its_exit_code(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    out = run_cvs("validate", cluster=missing, ci=False, timeout=None)
    assert out.returncode == ExitCode.USAGE
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and str(missing) in out.stderr


def test_status_json_row_keeps_its_keys() -> None:
    from orchestrator.containers.probe import HostState
    from orchestrator.containers.status import host_status
    from orchestrator.limits.resources import EffectiveResources

    state = HostState(
        host="n1",
        access="direct",
        container="running",
        container_image_id="sha256:" + "a" * 64,
        tag_image_id="sha256:" + "b" * 64,
        sshd_listening=False,
        provision_marker="c" * 64,
    )
    status = host_status(
        state,
        resources=EffectiveResources(pids=64),
        sshd_wanted=True,
        script_sha256="d" * 64,
        config_hash="h",
    )
    row = json.loads(json.dumps(status.to_dict()))
    assert row == {
        "host": "n1",
        "reachable": True,
        "access": "direct",
        "docker": "direct",  # deprecated: "access"
        "state": "running",
        "image": "aaaaaaaaaaaa",
        "tag": "bbbbbbbbbbbb",
        "stale": True,
        "sshd": "down",
        "provisioned": "other script (cccccccccccc)",
        "limits": EffectiveResources(pids=64).describe(),
        "drift": [],
        "init": None,  # not probed here: unknown, shown as unknown
        "error": None,
    }


def test_at_most_twelve_modules_sit_directly_under_the_package() -> None:
    modules = sorted(p.name for p in (ROOT / "orchestrator").glob("*.py"))
    assert len(modules) <= 12, f"add new modules inside a layer folder: {modules}"


def test_every_package_folder_says_its_job_in_its_init() -> None:
    import ast

    for init in sorted((ROOT / "orchestrator").glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and doc.strip(), f"{init.relative_to(ROOT)} needs a one-line docstring"
