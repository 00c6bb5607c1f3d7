"""What users of pdsh/clush, Ansible and kubectl expect of a CLI: help with examples,
--version, -x/--exclude, --forks/--limit, --color/NO_COLOR, completion, status -o."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import cvs as run_cvs
from clitools import cvs_in_process

from orchestrator import __version__
from orchestrator.cli import _apply_color, build_parser
from orchestrator.cli.common import CLI_STYLE, chosen_hosts
from orchestrator.config import load_cluster
from orchestrator.containers.status import HostStatus
from orchestrator.errors import UsageError
from orchestrator.render import STATUS_HEADERS, print_grouped
from orchestrator.render.live import print_status_table
from orchestrator.results import HostResult

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "name: lab\nhosts: ['node[01-12]', node14, login]\n"


def cvs_as_typed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`cvs` as a user types it: no CI=1 added (terminal habits are the point here)."""
    return run_cvs(*args, ci=False, env={"PYTHONPATH": str(REPO), **(env or {})}, timeout=120)


def _subcommand_paths(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths.extend(_subcommand_paths(sub, [*prefix, name]))
    return paths


SUBCOMMANDS = _subcommand_paths(build_parser(), [])


@pytest.mark.parametrize("path", SUBCOMMANDS, ids=lambda p: " ".join(p) or "cvs")
def test_every_help_has_an_example(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*path, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert re.search(r"(?im)^(examples?\b|start here:)", text), f"no example in cvs {path} --help"
    assert "cvs " in text.split("xample")[-1] or "Start here" in text


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_help_imports_no_heavy_dependency() -> None:
    code = (
        "import sys\nfrom orchestrator.cli import main\n"
        "for argv in (['--help'], ['cp', '--help'], ['status', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "heavy = ('asyncssh', 'pydantic', 'rich', 'anyio', 'jinja2', 'shtab')\n"
        "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr.strip() == "[]"


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_version_prints_the_package_version() -> None:
    proc = cvs_as_typed("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"cvs {__version__}"


# ---- host selection: --hosts and -x/--exclude --------------------------------------------


@pytest.fixture
def lab(tmp_path: Path) -> Any:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    return load_cluster(path)


@pytest.mark.parametrize(
    ("hosts", "exclude", "expected"),
    [
        (None, "node[02-12]", ["node01", "node14", "login"]),
        (
            "node*",
            "node1*",
            [
                "node01",
                "node02",
                "node03",
                "node04",
                "node05",
                "node06",
                "node07",
                "node08",
                "node09",
            ],
        ),
        (None, "login,node[01-11]", ["node12", "node14"]),
    ],
)
def test_exclude_removes_hosts_after_selection(
    lab: Any, hosts: str | None, exclude: str, expected: list[str]
) -> None:
    args = argparse.Namespace(hosts=hosts, exclude=exclude)
    assert chosen_hosts(lab, args) == expected


def test_exclude_naming_no_host_is_a_usage_error_not_ignored(lab: Any) -> None:
    # A typo must not run the command on the host meant to be spared.
    with pytest.raises(UsageError, match=r"--exclude 'nosuchhost'"):
        chosen_hosts(lab, argparse.Namespace(hosts=None, exclude="nosuchhost"))


def test_excluding_every_host_is_a_usage_error(lab: Any) -> None:
    with pytest.raises(UsageError, match="leaves no host"):
        chosen_hosts(lab, argparse.Namespace(hosts="login", exclude="log*"))


def test_forks_and_limit_set_the_host_concurrency(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    # In this process: `validate` decides all this before it contacts any host.
    for flag in ("--forks", "--limit"):
        proc = cvs_in_process("validate", "-c", str(path), flag, "3", "--json", ci=False)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["cluster"]["concurrency"]["hosts"] == 3
    proc = cvs_in_process("validate", "-c", str(path), "--forks", "0", ci=False)
    assert proc.returncode == 2 and "must be at least 1" in proc.stderr


# ---- colours ------------------------------------------------------------------------------


def test_color_never_sets_no_color_and_always_forces(monkeypatch: pytest.MonkeyPatch) -> None:
    # setenv first: monkeypatch then restores both, whatever _apply_color does.
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    _apply_color("never")
    assert os.environ["NO_COLOR"] == "1"
    _apply_color("always")
    assert "NO_COLOR" not in os.environ and os.environ["FORCE_COLOR"] == "1"
    _apply_color("auto")
    assert os.environ["FORCE_COLOR"] == "1"  # auto leaves the environment alone


def _statuses() -> list[HostStatus]:
    def one(host: str, state: str, reachable: bool = True) -> HostStatus:
        return HostStatus(
            host=host,
            reachable=reachable,
            access="direct" if reachable else None,
            state=state,
            image_id="sha256:" + "ab" * 32 if state == "running" else None,
            tag_image_id="sha256:" + "ab" * 32,
            sshd="listening" if state == "running" else "unknown",
            provisioned="yes" if state == "running" else "no",
            provision_marker=None,
            drift=("cpus 4 != 8",) if host == "node2" else (),
            error=None if reachable else "connection refused",
        )

    return [one("node1", "running"), one("node2", "exited"), one("node3", "unknown", False)]


def test_status_table_on_a_terminal_colours_the_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    from rich.console import Console

    Console(file=out, force_terminal=True, width=160).print(
        __import__("orchestrator.render.live", fromlist=["status_table"]).status_table(_statuses())
    )
    text = out.getvalue()
    assert "\x1b[32mrunning" in text  # green
    assert "\x1b[33mexited" in text  # yellow
    assert "\x1b[1;31munknown" in text  # bold red
    assert "1 (-o wide)" in text  # drift is counted in the narrow table


def test_status_plain_wide_has_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    print_status_table(_statuses(), wide=True, plain=True, out=out, style=CLI_STYLE)
    header = out.getvalue().splitlines()[0].split()
    # The access column is named for the cluster's runtime (here docker).
    assert header == ["docker" if c == "access" else c for c in STATUS_HEADERS]
    assert "\x1b[" not in out.getvalue()
    # `?` (what could not be probed) is explained once, with the first reason;
    # stderr keeps one `HOST: reason` line per host, the table one row per host.
    # An exited container's `?` says why too (issue 30).
    assert capsys.readouterr().err == (
        "node2: sshd not known while the container is exited (`cvs up` starts it again)\n"
        "node3: connection refused; ? in the table: not known, for this reason\n"
    )
    assert len(out.getvalue().splitlines()) == 4
    node3 = out.getvalue().splitlines()[3].split()
    assert node3[:3] == ["node3", "no", "?"] and node3.count("?") == 6, (
        node3
    )  # docker image stale sshd provisioned drift


def test_exec_group_header_has_count_and_compressed_hostlist() -> None:
    hosts = [f"node{i:02d}" for i in [*range(1, 13), 14]]
    results = {h: HostResult(h, "ok", exit_code=0, stdout="same") for h in hosts}
    results["login"] = HostResult("login", "failed", exit_code=2, stdout="other")
    out = io.StringIO()
    print_grouped(results, out=out)
    lines = out.getvalue().splitlines()
    assert "node[01-12,14] (13) ok" in lines
    assert "login (1) failed exit 2" in lines


def test_exec_group_on_a_terminal_colours_each_header(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from orchestrator.render.live import print_grouped_rich

    monkeypatch.delenv("NO_COLOR", raising=False)
    results = {
        f"node{i}": HostResult(f"node{i}", "ok", exit_code=0, stdout="[b]x[/b]") for i in (1, 2)
    }
    results["node3"] = HostResult("node3", "failed", exit_code=1, stdout="boom")
    out = io.StringIO()
    print_grouped_rich(results, Console(file=out, force_terminal=True, width=80))
    text = out.getvalue()
    assert "node[1-2]" in text and "(2)" in text and "\x1b[1;32mok" in text
    assert "\x1b[1;31mfailed exit 1" in text
    assert "[b]x[/b]" in text  # output is text, never markup


# ---- completion ---------------------------------------------------------------------------


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_bash_completion_is_valid_bash_and_knows_the_commands() -> None:
    proc = cvs_as_typed("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run(["bash", "-n"], input=proc.stdout, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    for word in ("status", "cp", "runs", "shell", "--exclude", "--hosts-from"):
        assert word in proc.stdout
    loaded = subprocess.run(
        ["bash", "-c", "source /dev/stdin; complete -p cvs"],
        input=proc.stdout,
        text=True,
        capture_output=True,
    )
    assert loaded.returncode == 0 and "cvs" in loaded.stdout


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_bash_completes_host_names_from_the_cluster_file(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "cvs"  # the `cvs` the completion function calls: this tree's
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m orchestrator "$@"\n')
    wrapper.chmod(0o755)
    script = cvs_as_typed("completion", "bash").stdout
    probe = (
        'source /dev/stdin; COMP_WORDS=(cvs -c "$CLUSTER" shell node1); COMP_CWORD=4; '
        '_shtab_cvs; echo "${COMPREPLY[*]}"; '
        'COMP_WORDS=(cvs exec -c "$CLUSTER" -x lo); COMP_CWORD=5; _shtab_cvs; '
        'echo "${COMPREPLY[*]}"'
    )
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CLUSTER": str(cluster)}
    proc = subprocess.run(
        ["bash", "-c", probe], input=script, text=True, capture_output=True, env=env, timeout=60
    )
    shell_words, exclude_words = proc.stdout.splitlines()
    assert shell_words.split() == ["node10", "node11", "node12", "node14"]
    assert exclude_words == "login"


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_zsh_completion_is_a_compdef_for_cvs(tmp_path: Path) -> None:
    proc = cvs_as_typed("completion", "zsh")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#compdef cvs")
    if not shutil.which("zsh"):  # .ci/bootstrap installs it
        pytest.skip("zsh is not installed")
    check = subprocess.run(["zsh", "-n"], input=proc.stdout, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr
    # Installed as docs/cli.md says (`_cvs` first in fpath), compinit binds ours to
    # `cvs` rather than zsh's own _cvs (for the CVS version control system).
    (tmp_path / "_cvs").write_text(proc.stdout)
    script = (
        f"fpath=({tmp_path} $fpath); autoload -U compinit; compinit -u -D; "
        "print -- ${_comps[cvs]}; whence -v _cvs"
    )
    loaded = subprocess.run(["zsh", "-f", "-c", script], text=True, capture_output=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("\n")[0] == "_cvs"
    assert f"from {tmp_path}/_cvs" in loaded.stdout


def test_status_output_yaml_on_the_sandbox(sandbox: Any) -> None:
    proc = cvs_as_typed("status", "-c", str(sandbox.cluster_file), "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    assert list(doc["hosts"]) == ["node1", "node2", "node3", "node4"]
    assert all(h["reachable"] for h in doc["hosts"].values())
    assert doc["command"] == "status"  # the same document as -o json


def test_status_output_wide_when_piped_is_aligned_text(sandbox: Any) -> None:
    proc = cvs_as_typed("status", "-c", str(sandbox.cluster_file), "-o", "wide")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split()[-2:] == ["limits", "drift"]
    assert "\x1b[" not in proc.stdout


def test_exec_exclude_on_the_sandbox(sandbox: Any) -> None:
    proc = cvs_as_typed(
        "exec",
        "-c",
        str(sandbox.cluster_file),
        "--host-os",
        "--group",
        "-x",
        "node3",
        "--",
        "echo",
        "hi",
    )
    assert proc.returncode == 0, proc.stderr
    assert "node[1-2,4] (3) ok" in proc.stdout.splitlines()


def test_color_always_keeps_the_coloured_status_table_through_a_pipe(sandbox: Any) -> None:
    proc = cvs_as_typed(
        "--color", "always", "status", "-c", str(sandbox.cluster_file), env={"CI": ""}
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" in proc.stdout and "┏━" in proc.stdout
