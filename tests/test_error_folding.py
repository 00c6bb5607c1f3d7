"""Failures fold as docs/cli-output.md says: one line per distinct error with its
hostlist; host names and addresses, container IDs and docker's usage hints do
not make two errors distinct (orchestrator/errortext.py)."""

from __future__ import annotations

from orchestrator.cli.common import failure_summary
from orchestrator.errortext import fold_errors, fold_key, short_text
from orchestrator.results import HostResult

RUN_ERROR = (
    "run: {cid}\ndocker: Error response from daemon: Unable to find group render: no matching "
    "entries in group file\n\nRun 'docker run --help' for more information\n"
)
IDS = [
    "9b0682d172f343466380749a6c7665fa393a7f70ef6dc0ff8d0501cc0baeed78",
    "a5e3" + "0" * 60,
    "ff" * 32,
]


def test_one_docker_error_on_three_hosts_is_one_line_without_ids_or_usage_hints() -> None:
    errors = {f"node{i + 1}": RUN_ERROR.format(cid=cid) for i, cid in enumerate(IDS)}
    [(hosts, text)] = fold_errors(errors)
    assert hosts == ["node1", "node2", "node3"]
    assert "--help" not in text and "\n" not in text
    assert IDS[0] not in text and "<id>" in text
    assert text.startswith("run: <id> docker: Error response from daemon: Unable to find group")


def test_a_shared_id_is_shown_abbreviated() -> None:
    errors = {h: f"start {IDS[0]}: failed" for h in ("n1", "n2")}
    assert fold_errors(errors) == [(["n1", "n2"], f"start {IDS[0][:12]}: failed")]


def test_auth_errors_naming_each_hosts_address_fold() -> None:
    aliases = {f"node{i}": [f"10.201.38.{i}"] for i in (1, 2, 3)}
    errors = {
        h: f"auth: authentication failed: Permission denied for user cvs on host {a[0]}"
        for h, a in aliases.items()
    }
    [(hosts, text)] = fold_errors(errors, aliases)
    assert len(hosts) == 3
    assert text == "auth: authentication failed: Permission denied for user cvs on host <host>"


def test_one_host_keeps_its_own_names() -> None:
    errors = {"node1": "lost connection to node1 (10.0.0.1)", "node2": "exit code 1"}
    groups = dict((h[0], t) for h, t in fold_errors(errors, {"node1": ["10.0.0.1"]}))
    assert groups["node1"] == "lost connection to node1 (10.0.0.1)"


def test_a_name_inside_a_longer_one_is_left_alone() -> None:
    assert short_text("node1 and node10, 10.0.0.1 and 10.0.0.12", ["node1", "10.0.0.1"]) == (
        "<host> and node10, <host> and 10.0.0.12"
    )


def test_different_errors_stay_apart_largest_group_first() -> None:
    errors = {"a": "exit code 1", "b": "exit code 2", "c": "exit code 2"}
    assert fold_errors(errors) == [(["b", "c"], "exit code 2"), (["a"], "exit code 1")]
    assert fold_key("x\n\nSee 'docker run --help'.") == "x"


def test_the_exec_summary_is_one_line_per_distinct_error() -> None:
    results = {
        f"node{i}": HostResult(
            host=f"node{i}", status="unreachable", error=f"ssh error: connection lost to 10.0.0.{i}"
        )
        for i in (1, 2, 3)
    }
    aliases = {h: [f"10.0.0.{h[-1]}"] for h in results}
    [line] = failure_summary(results, aliases)
    assert line.startswith("node[1-3] (3): unreachable: ssh error: connection lost to <host>")
