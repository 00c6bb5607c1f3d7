"""Command-line edges (issue 25): no option matched by abbreviation, and every
command that works on hosts takes --hosts and -x."""

from __future__ import annotations

import argparse

import pytest
from clitools import cvs as run_cvs

from orchestrator.cli.parser import build_parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_parser_matches_an_option_by_its_prefix() -> None:
    for parser in _parsers(build_parser()):
        assert parser.allow_abbrev is False, parser.prog


@pytest.mark.parametrize("argv", [["plan", "--hosts", "node1"], ["status", "--host", "node1"]])
def test_a_prefix_of_hosts_from_is_not_taken_for_it(argv: list[str]) -> None:
    parser = build_parser()
    if argv[1] == "--hosts":
        args = parser.parse_args(argv)
        assert args.hosts == "node1" and getattr(args, "hosts_from", None) is None
    else:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


@pytest.mark.parametrize("command", ["exec", "cp", "plan", "up", "status", "down"])
def test_every_command_on_hosts_takes_hosts_and_exclude(command: str) -> None:
    extra = {"exec": ["--", "true"], "cp": ["a", "b"]}.get(command, [])
    args = build_parser().parse_args([command, "--hosts", "n[1-3]", "-x", "n2", *extra])
    assert (args.hosts, args.exclude) == ("n[1-3]", "n2")


def test_hosts_and_exclude_narrow_the_cluster_for_whole_cluster_commands(tmp_path: object) -> None:
    from pathlib import Path

    from orchestrator.cli.common import load

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text("hosts: ['n[1-4]']\nhead: n1\nssh: {user: u}\n")
    args = build_parser().parse_args(["status", "-c", str(path), "--hosts", "n[1-3]", "-x", "n1"])
    cluster = load(args)
    assert [h.name for h in cluster.hosts] == ["n2", "n3"]
    assert cluster.head_host.name == "n2"  # the head was left out: the first chosen host


def test_shell_says_on_which_host_the_container_is_not_running(tmp_path: object) -> None:
    from pathlib import Path

    from orchestrator.cli.shell import remote_command
    from orchestrator.config import load_cluster

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text("hosts: [node7]\nssh: {user: u}\ncontainer: {image: i:1, name: c1}\n")
    script = remote_command(
        load_cluster(path, check_files=False), host_os=False, tty=False, host="node7"
    )
    assert "container c1 is not running on node7 (run `cvs up`)" in script
    assert "running here" not in script


@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_bash_completes_suite_names_and_run_ids(tmp_path: object) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    tmp = Path(str(tmp_path))
    repo = Path(__file__).resolve().parent.parent
    bindir = tmp / "bin"
    bindir.mkdir()
    wrapper = bindir / "cvs"  # the `cvs` the completion functions call: this tree's
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} -m orchestrator "$@"\n')
    wrapper.chmod(0o755)
    (tmp / "elsewhere" / "20260101T000000Z-test_demo").mkdir(parents=True)
    (tmp / "runs" / "20250101T120000Z-install_demo").mkdir(parents=True)
    completion = run_cvs("completion", "bash", ci=False, timeout=None)
    completion.check_returncode()
    script = completion.stdout
    probe = (
        "source /dev/stdin; COMP_WORDS=(cvs run te); COMP_CWORD=2; _shtab_cvs; "
        'echo "${COMPREPLY[*]}"; '
        "COMP_WORDS=(cvs runs show ''); COMP_CWORD=3; _shtab_cvs; echo \"${COMPREPLY[*]}\"; "
        'COMP_WORDS=(cvs runs show --dir "$TMP/elsewhere" 2026); COMP_CWORD=5; _shtab_cvs; '
        'echo "${COMPREPLY[*]}"'
    )
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "TMP": str(tmp)}
    proc = subprocess.run(
        ["bash", "-c", probe],
        input=script,
        text=True,
        capture_output=True,
        env=env,
        cwd=tmp,
        timeout=60,
    )
    suites, runs, elsewhere = proc.stdout.splitlines()
    assert "test_demo" in suites.split(), proc.stderr
    assert sorted(runs.split()) == ["20250101T120000Z-install_demo", "latest"]
    assert elsewhere == "20260101T000000Z-test_demo"


def test_a_refusal_says_nothing_changed_once_and_never_when_something_did(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli.common import print_refusal
    from orchestrator.errors import PolicyRefused

    args = build_parser().parse_args(["up"])
    args.json = False
    reason = "held by alice; nothing was changed: retry later"
    assert print_refusal(args, PolicyRefused([reason])) == 4
    assert capsys.readouterr().err == (
        "cvs: refused, nothing was changed:\n  - held by alice: retry later\n"
    )
    after_pull = PolicyRefused(["image skew"], changed=["image x:1 pulled on node1"])
    print_refusal(args, after_pull)
    err = capsys.readouterr().err
    assert "nothing was changed" not in err
    assert err.startswith("cvs: refused (no container changed; done before: image x:1 pulled")


def test_cp_names_the_host_whose_container_is_not_running(tmp_path: object) -> None:
    from pathlib import Path

    from orchestrator.config import load_cluster
    from orchestrator.containers.copy import _wrap

    path = Path(str(tmp_path)) / "c.yaml"
    path.write_text("hosts: [node7]\nssh: {user: u}\ncontainer: {image: i:1, name: c1}\n")
    script = _wrap(load_cluster(path, check_files=False), ["true"], False, host="node7")
    assert "container c1 is not running on node7" in script
    assert "running here" not in script
