"""The argument parser of `cvs`: every subcommand, its options and its example.

Kept free of heavy imports (asyncssh, pydantic, rich): `cvs --help` and
`cvs CMD --help` build only this. Each subcommand names its handler as
"module:function" under orchestrator.cli, imported when it runs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from orchestrator import __version__

if TYPE_CHECKING:
    # What `ArgumentParser.add_subparsers()` returns; argparse has no public name for it.
    _Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

DEFAULT_SANDBOX_DIR = "/tmp/cvs-sandbox"
NO_WAIT_HELP = (
    "when another cvs invocation holds a host's lock in a conflicting way, refuse "
    "(exit 4, naming it) instead of waiting for it"
)


def positive_seconds(text: str) -> float:
    """argparse type for timeouts: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds above 0, got {text!r}"
        )
    return value


def host_count(text: str) -> int:
    """argparse type for `--hosts N`: a whole number up to 250 (0 only with --egress)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of hosts, got {text!r}") from None
    if not 0 <= value <= 250:
        raise argparse.ArgumentTypeError(f"expected 1 to 250 hosts, got {value}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse with prefix matching off: `--hosts` must never be taken as the
    start of `--hosts-from` (or any option as another's abbreviation), on the
    main parser and on every subparser alike."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def _version() -> str:
    return __version__


RUN_EPILOG = """\
suites are found by name in ./suites, then each directory of $CVS_SUITES_PATH,
then the examples shipped with cvs (install_demo, test_demo); or give a path.

example (persistent containers: the install survives into the next run):
  cvs -c cluster.yaml run install_demo
  cvs -c cluster.yaml run test_demo

CVS's own test suites (pytest modules, found in the installed cvs.tests package
as CVS finds them, or a path), unchanged, on this engine:
  cvs run install_rvs --cluster_file cluster.json --config_file rvs_config.json
  cvs run rvs_cvs test_gst --cluster_file cluster.json --config_file rvs_config.json
options cvs run does not know go to pytest, as under CVS (-k EXPR, -x, --maxfail N);
everything after -- goes to pytest too (for -v, or a value that looks like FUNCTION):
  cvs run rvs_cvs --cluster_file cluster.json --config_file rvs_config.json -k gst -x
  cvs run rvs_cvs --cluster_file cluster.json --config_file rvs_config.json -- -v
"""


def add_run_parser(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """Add `cvs run` to cli.py's subcommands (`sub`), sharing its `common` options."""
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run a suite of steps across the cluster and record the results",
        description="Bring containers up per the cluster's lifetime, run the suite's steps in "
        "order (each on its hosts at once), bring them down per the lifetime (per_run: "
        "removed, also on failure or Ctrl-C). Writes a run directory with events.jsonl, "
        "per-host per-step logs, results.json and junit.xml.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    suite = p.add_argument(
        "suite", nargs="?", metavar="SUITE", help="suite name or path to a suite file"
    )
    suite.complete = SUITE_COMPLETION  # type: ignore[attr-defined]
    p.add_argument(
        "function", nargs="*", metavar="FUNCTION", help="CVS test: run only these test functions"
    )
    p.add_argument("--list", action="store_true", help="list the suites found, and where")
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where to write the run records (default runs/<UTC time>-<suite>/)",
    )
    p.add_argument("--no-wait", action="store_true", help=NO_WAIT_HELP)
    cvs = p.add_argument_group(
        "CVS test suites", "SUITE is a CVS test module (pytest), run with CVS's syntax"
    )
    cvs.add_argument("--cluster_file", metavar="C", help="CVS cluster JSON")
    cvs.add_argument("--config_file", metavar="T", help="CVS test config JSON")
    cvs.add_argument("--html", metavar="R", help="pytest-html report (needs pytest-html)")
    cvs.add_argument("--log-file", metavar="L", help="pytest log file (default RUN_DIR/TEST.log)")
    p.set_defaults(func="run:cmd_run", pytest_args=[])


EPILOG = """\
exit codes: 0 ok · 1 a command failed on some host · 2 usage or config error ·
3 some host unreachable · 4 refused by policy · 130 interrupted

Start here:  cvs sandbox up --hosts 4      # a local 4-host cluster, prints its cluster.yaml
             cvs -c /tmp/cvs-sandbox/cluster.yaml up       # start its containers
             cvs -c /tmp/cvs-sandbox/cluster.yaml exec -- hostname
"""


def _common_options(*, subcommand: bool) -> argparse.ArgumentParser:
    """-c/--json/-v, accepted before and after the subcommand.

    A subparser writes its defaults over what the main parser parsed, so in
    subcommands they default to SUPPRESS: otherwise `cvs -c FILE up` would
    silently drop FILE. (Separate parsers: `parents` shares Action objects.)
    """
    common = Parser(add_help=False)
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if subcommand else {}
    common.add_argument(
        "-c",
        "--cluster",
        metavar="FILE",
        help="cluster file (default: $CVS_CLUSTER, then ./cluster.yaml)",
        **unset,
    )
    common.add_argument("--json", action="store_true", help="JSON lines on stdout", **unset)
    common.add_argument(
        "-v", "--verbose", action="store_true", help="more progress detail", **unset
    )
    common.add_argument(
        "--hosts-from",
        choices=["slurm"],
        metavar="SOURCE",
        help="take the hosts from SOURCE instead of the file: slurm (the running job's "
        "nodes and addresses, asked of scontrol)",
        **unset,
    )
    common.add_argument(
        "--forks",
        "--limit",
        dest="forks",
        type=_positive_int,
        metavar="N",
        help="work on at most N hosts at once (the cluster's concurrency.hosts)",
        **unset,
    )
    common.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        help="colours: auto (default: on a terminal, unless NO_COLOR is set), always, never",
        **unset,
    )
    return common


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# Completion of host names (cli/completion.py defines the shell function); a plain
# attribute the completion generator reads, so this module still imports argparse only.
HOST_COMPLETION = {"bash": "_cvs_hosts", "zsh": "_cvs_hosts"}
SUITE_COMPLETION = {"bash": "_cvs_suites", "zsh": "_cvs_suites"}
RUN_COMPLETION = {"bash": "_cvs_runs", "zsh": "_cvs_runs"}


def add_host_selection(p: argparse.ArgumentParser, *, narrows: bool = False) -> None:
    """--hosts and -x/--exclude, the same on every command that picks hosts.

    `narrows`: the command works on the cluster as a whole (plan, up, status,
    down), so the selection narrows the cluster to those hosts, as a Slurm
    allocation of part of it would (cli.common.load)."""
    hosts = p.add_argument(
        "--hosts", metavar="PATTERN", help="names, globs or hostlists, comma-separated"
    )
    exclude = p.add_argument(
        "-x",
        "--exclude",
        metavar="PATTERN",
        help="leave out these hosts (names, globs or hostlists, comma-separated)",
    )
    hosts.complete = exclude.complete = HOST_COMPLETION  # type: ignore[attr-defined]
    if narrows:
        p.set_defaults(narrow_hosts=True)


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(subcommand=True)

    parser = Parser(
        prog="cvs",
        description="Keep one named test container per GPU host in the state a run needs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common_options(subcommand=False)],
    )
    parser.add_argument("--version", action="version", version=f"cvs {_version()}")
    sub: _Subparsers = parser.add_subparsers(
        dest="command_name", metavar="COMMAND", required=True, parser_class=Parser
    )

    _add_validate_parser(sub, common)
    _add_exec_parser(sub, common)
    _add_lifecycle_parsers(sub, common)
    _add_status_parser(sub, common)
    _add_down_parser(sub, common)
    add_run_parser(sub, common)
    _add_sandbox_parser(sub, common)
    add_tools_parsers(sub, common)
    return parser


def _add_validate_parser(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`validate`."""
    p = sub.add_parser(
        "validate",
        parents=[common],
        help="check a cluster file and print it normalized",
        description="Load the cluster file, expand hostlists, fill defaults, print the result. "
        "Exit 2 with one line naming the file and key on any problem.",
        epilog="example: cvs validate -c cluster.yaml --no-check-files",
    )
    p.add_argument(
        "--no-check-files",
        action="store_true",
        help="do not require identity files and setup scripts to exist here",
    )
    p.set_defaults(func="validate:cmd_validate")


def _add_exec_parser(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`exec`."""
    p = sub.add_parser(
        "exec",
        parents=[common],
        help="run a command on every host (in the container when there is one)",
        description="Run CMD on the selected hosts at once, over one SSH connection per host. "
        "With a container block and a running container, CMD runs inside it; "
        "--host-os runs it on the host itself. One argument is shell text; several are argv.",
        epilog="example: cvs exec --hosts 'node[1-2]' --timeout 30 -- nvidia-smi -L",
    )
    add_host_selection(p)
    p.add_argument(
        "--timeout", type=positive_seconds, metavar="S", help="per-host timeout in seconds"
    )
    p.add_argument("--group", action="store_true", help="fold identical output (like dshbak -c)")
    p.add_argument("--host-os", action="store_true", help="run on the host, not in the container")
    p.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="VAR=VAL",
        help="set an environment variable for CMD (repeatable)",
    )
    p.add_argument("-w", "--workdir", metavar="DIR", help="working directory in the container")
    p.add_argument(
        "-u",
        "--user",
        metavar="USER",
        help="user in the container (default: container.user, else the image's USER)",
    )
    p.add_argument("--no-wait", action="store_true", help=NO_WAIT_HELP)
    p.add_argument(
        "-n",
        "--no-stdin",
        action="store_true",
        help="close CMD's stdin (as ssh -n); without it, cvs's stdin goes to CMD on every "
        "selected host, streamed, the same bytes to each (as clush does), unless it is a "
        "terminal or /dev/null",
    )
    p.add_argument(
        "-N",
        "--no-prefix",
        action="store_true",
        help="one host: its stdout and stderr as they are, byte for byte, without the "
        "`host | ` prefix (`cvs exec -N --hosts node1 -- cat f > copy`)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="the command: one argument is shell text, several are argv",
    )
    p.set_defaults(func="exec:cmd_exec")


def _add_lifecycle_parsers(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`plan` and `up`."""
    lifecycle_epilog = (
        "lifetimes: no_launch (use running containers, never start any),\n"
        "           per_run (fresh each run, removed by down),\n"
        "           persistent (kept between runs; a partial set is refused)"
    )
    p = sub.add_parser(
        "plan",
        parents=[common],
        help="show what `up` would do on each host (dry run)",
        description="Probe every host (one round trip each) and print the action `up` would take "
        "and why. Changes nothing. Exit 4 when `up` would be refused.",
        epilog=f"{lifecycle_epilog}\n\nexample: cvs -c cluster.yaml plan --force",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--force", action="store_true", help="plan as `up --force` would")
    p.add_argument("--reprovision", action="store_true", help="plan as `up --reprovision` would")
    p.add_argument("--adopt", action="store_true", help="plan as `up --adopt` would")
    p.add_argument("--heal", action="store_true", help="plan as `up --heal` would")
    add_host_selection(p, narrows=True)
    p.set_defaults(func="cluster:cmd_plan")

    p = sub.add_parser(
        "up",
        parents=[common],
        help="bring the containers up per the lifetime policy",
        description="Lock and probe every host, decide per the lifetime policy, then on each host "
        "independently: pull/load, run, provision (setup script), start the in-container sshd. "
        "Exit 4 (nothing changed) when refused: partial persistent set, image skew, unreadable "
        "image, unknown host state.",
        epilog=f"{lifecycle_epilog}\n\nexample: cvs -c cluster.yaml up --reprovision",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace containers instead of refusing (removes persistent or foreign ones)",
    )
    p.add_argument(
        "--reprovision", action="store_true", help="run the setup script again on kept containers"
    )
    p.add_argument(
        "--adopt",
        action="store_true",
        help="persistent: take over running same-named containers cvs did not start (e.g. "
        "CVS's), after the image check, instead of refusing; ownership is recorded per host",
    )
    p.add_argument(
        "--heal",
        action="store_true",
        help="persistent: start the container where it is missing while every other host "
        "runs it, from the same image (instead of refusing the partial set); with --hosts, "
        "only on those hosts",
    )
    p.add_argument("--no-wait", action="store_true", help=NO_WAIT_HELP)
    add_host_selection(p, narrows=True)
    p.set_defaults(func="cluster:cmd_up")


def _add_status_parser(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`status`."""
    p = sub.add_parser(
        "status",
        parents=[common],
        help="table of hosts: container, image, sshd, provisioning, drift",
        description="Probe every host and show reachability, docker access, container state, "
        "image and tag IDs (stale?), sshd, provisioning marker, effective limits and drift.",
        epilog="exit codes (the worst that applies):\n"
        "  0  every host probed; an absent or stopped container is a state, not an error\n"
        "  1  a host was reached but its docker state is unknown: daemon down, no docker\n"
        "     access, docker not installed, unreadable probe output (`HOST: reason` on\n"
        "     stderr; the row's error with -o json/yaml)\n"
        "  3  a host was not reachable over SSH\n"
        "\n"
        "example: cvs status -o wide          # also limits, provisioning and drift\n"
        "         cvs status -o json | jq '.hosts[] | select(.state != \"running\")'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "wide", "json", "yaml"],
        default=None,
        help="table (default), wide (every column), json or yaml",
    )
    add_host_selection(p, narrows=True)
    p.set_defaults(func="cluster:cmd_status")


def _add_down_parser(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`down`."""
    p = sub.add_parser(
        "down",
        parents=[common],
        help="remove containers per the lifetime (persistent: only with --force)",
        description="per_run: remove our containers. persistent: keep them (--force removes). "
        "no_launch: nothing. A same-named container cvs did not create is kept unless --force.",
        epilog="example: cvs -c cluster.yaml down --force   # also removes persistent containers",
    )
    p.add_argument("--force", action="store_true", help="also remove persistent/foreign ones")
    p.add_argument("--no-wait", action="store_true", help=NO_WAIT_HELP)
    add_host_selection(p, narrows=True)
    p.set_defaults(func="cluster:cmd_down")


def _add_sandbox_parser(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`sandbox up|down`."""
    p = sub.add_parser(
        "sandbox",
        parents=[common],
        help="a local multi-host cluster on this machine (root)",
        description="Build or remove a sandbox cluster: N network namespaces on a private bridge, "
        "each with its own sshd and dockerd, and a cluster.yaml to drive them.",
        epilog="example: cvs sandbox up --hosts 3 --dir /tmp/cvs-sandbox",
    )
    sandbox_sub: _Subparsers = p.add_subparsers(
        dest="sandbox_command", metavar="up|down", required=True, parser_class=Parser
    )
    up = sandbox_sub.add_parser(
        "up",
        parents=[common],
        help="build the sandbox",
        description="Build a sandbox cluster of --hosts hosts under --dir: a network namespace, "
        "an sshd and a container runtime per host, the images loaded on each, and a "
        "cluster.yaml that drives them (its path is printed). Needs root.",
        epilog="example: cvs sandbox up --hosts 3 --lifetime persistent",
    )
    up.add_argument(
        "--hosts", type=host_count, default=4, metavar="N", help="number of hosts (default 4)"
    )
    up.add_argument("--dir", help=f"where it lives (default {DEFAULT_SANDBOX_DIR})")
    up.add_argument(
        "--lifetime",
        choices=["per_run", "persistent", "no_launch", "per_job"],
        default="per_run",
        help="container lifetime written into the cluster file (default per_run; per_job, "
        "with --slurm: kept across invocations inside one Slurm job, gone with it)",
    )
    up.add_argument(
        "--egress", action="store_true", help="add a host whose containers reach Debian mirrors"
    )
    up.add_argument(
        "--runtime",
        choices=["docker", "podman"],
        default="docker",
        help="what runs each host's containers: a dockerd of its own (default), or a podman "
        "store of its own (rootful, reached with `sudo -n podman`)",
    )
    up.add_argument(
        "--rootless",
        action="store_true",
        help="with --runtime podman: the cluster file drives the login user's own rootless "
        "podman (the images are loaded into each node's rootless store)",
    )
    up.add_argument(
        "--mpi",
        action="store_true",
        help="the cluster file's image has Debian 12's Open MPI and mpi4py (built once, "
        "cached; see docs/mpi.md)",
    )
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also run a real Slurm over the hosts (munge, slurmctld, one slurmd per host); "
        "source DIR/slurm.env to use sinfo, srun, salloc, sbatch, scontrol",
    )
    up.add_argument(
        "--gpus",
        type=int,
        default=0,
        metavar="K",
        help="K stand-in GPUs per host (a device root the cluster file names; with --slurm "
        "declared as gres gpu:K)",
    )
    _add_sandbox_registry_args(up)
    down = sandbox_sub.add_parser(
        "down",
        parents=[common],
        help="remove everything it made",
        description="Remove the sandbox under --dir: its hosts' containers, daemons, sshds, "
        "network namespaces, bridge and files; what other sandboxes use stays.",
        epilog="example: cvs sandbox down --dir /tmp/cvs-sandbox",
    )
    down.add_argument("--dir", help=f"where it lives (default {DEFAULT_SANDBOX_DIR})")
    p.set_defaults(func="sandbox:cmd_sandbox")


def _add_sandbox_registry_args(up: argparse.ArgumentParser) -> None:
    """`sandbox up --registry [--registry-rate RATE]`."""
    up.add_argument(
        "--registry",
        action="store_true",
        help="docker or rootful podman hosts: a registry in a network namespace of its own "
        "on the bridge holds the cluster's image under a name no host has (the hosts pull it "
        "at `cvs up`); the cluster file names it and its login; DIR/registry.env sets "
        "REGISTRY, REGISTRY_NETNS and REGISTRY_IF (whose tx_bytes count what it served); "
        "podman: the cluster file sets container.registry_tls_verify: false (plain HTTP)",
    )
    up.add_argument(
        "--registry-rate",
        metavar="RATE",
        help="with --registry: shape the registry's link to RATE (tc tbf), digits then bit, "
        "kbit, mbit or gbit, e.g. 20mbit (default: unshaped)",
    )


# ---- cp, runs, shell, completion ------------------------------------------------


def add_tools_parsers(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """The everyday tools: files to every host, past runs, a shell, completion."""
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "cp",
        parents=[common],
        help="copy a file or directory to every host (or gather one from each)",
        description="Copy SRC (a file or a directory) to DEST on every selected host, into the "
        "container by default (--host-os: onto the host), streamed as tar over the open SSH "
        "connection and checked by sha256. With --from-host, SRC is a path on each host and "
        "DEST a local directory: each host's copy lands in DEST/<host>/.",
        epilog="examples:\n"
        "  cvs cp ./rccl-tests.tar.gz /opt/             # into every container\n"
        "  cvs cp --host-os -x node3 ./fix.sh /tmp/fix.sh\n"
        "  cvs cp --from-host /var/log/dmesg.txt ./collected   # ./collected/<host>/dmesg.txt",
        formatter_class=raw,
    )
    add_host_selection(p)
    p.add_argument("--host-os", action="store_true", help="copy onto the host, not the container")
    p.add_argument(
        "--from-host", action="store_true", help="gather SRC from every host into DEST/<host>/"
    )
    p.add_argument(
        "--timeout", type=positive_seconds, metavar="S", help="per-host timeout in seconds"
    )
    p.add_argument(
        "src", metavar="SRC", help="a local file or directory (--from-host: a path on each host)"
    )
    p.add_argument(
        "dest", metavar="DEST", help="where it goes, like cp -r (--from-host: a local directory)"
    )
    p.set_defaults(func="files:cmd_cp")

    p = sub.add_parser(
        "runs",
        parents=[common],
        help="list past suite runs (newest first), or show one",
        description="Past runs under ./runs (or --dir): suite, start time, outcome, hosts ok / "
        "failed, path. `cvs runs show RUN` prints one run's step x host table and failures.",
        epilog="examples:\n"
        "  cvs runs\n"
        "  cvs runs show 20250101T120000Z-test_demo    # or: cvs runs show latest",
        formatter_class=raw,
    )
    p.add_argument("--dir", default="runs", help="where the runs are (default ./runs)")
    runs_sub: _Subparsers = p.add_subparsers(
        dest="runs_command", metavar="show", parser_class=Parser
    )
    show = runs_sub.add_parser(
        "show",
        parents=[common],
        help="print one run",
        description="Print one past run: suite, cluster, image, start time, the step x host "
        "table and each failure's reason. --json: the run's results.json under `run` (its "
        "verdict: run.ok, run.exit_code); the top-level ok and exit_code are this command's.",
        epilog="example: cvs runs show latest",
    )
    run = show.add_argument(
        "run", metavar="RUN", help="run directory, its name under --dir, or latest"
    )
    run.complete = RUN_COMPLETION  # type: ignore[attr-defined]
    show.add_argument(
        "--dir", default=argparse.SUPPRESS, help="where the runs are (default ./runs)"
    )
    p.set_defaults(func="runs:cmd_runs")
    _add_shell_parsers(sub, common)


def _add_shell_parsers(sub: _Subparsers, common: argparse.ArgumentParser) -> None:
    """`shell` and `completion`."""
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "shell",
        parents=[common],
        help="an interactive shell in one host's container",
        description="Open an interactive shell (bash if the container has it, else sh) in HOST's "
        "container over SSH, with the cluster's SSH settings and host-key policy. --host-os "
        "opens it on the host instead.",
        epilog="example: cvs -c cluster.yaml shell node1",
    )
    p.add_argument("host", metavar="HOST", help="a host of the cluster").complete = HOST_COMPLETION  # type: ignore[attr-defined]
    p.add_argument("--host-os", action="store_true", help="a shell on the host itself")
    p.set_defaults(func="shell:cmd_shell")

    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print the completion script for SHELL on stdout.",
        epilog="examples:\n"
        "  source <(cvs completion bash)                    # this shell\n"
        "  cvs completion zsh > ~/.zfunc/_cvs               # zsh: fpath+=(~/.zfunc)",
        formatter_class=raw,
    )
    p.add_argument("shell", choices=["bash", "zsh"], metavar="SHELL", help="bash or zsh")
    p.set_defaults(func="completion:cmd_completion")

    p = sub.add_parser(
        "slurm",
        help="what cvs ships for Slurm sites (the epilog)",
        description="Slurm helpers. Inside a job cvs needs nothing installed: per_run and per_job "
        "containers end with the job through a holder step. The epilog is for sites that "
        "also want them removed after a node failure.",
        epilog="example: cvs slurm epilog --install /etc/slurm/epilog.d/cvs.sh",
    )
    slurm_sub: _Subparsers = p.add_subparsers(
        dest="slurm_command", metavar="epilog", required=True, parser_class=Parser
    )
    ep = slurm_sub.add_parser(
        "epilog",
        parents=[common],  # `cvs slurm epilog --json` as `cvs --json slurm epilog`
        help="print (or --install) the Slurm epilog that removes a job's per_run and per_job "
        "containers",
        epilog="examples:\n"
        "  cvs slurm epilog                                  # print it\n"
        "  cvs slurm epilog --install /etc/slurm/epilog.d/cvs.sh",
        formatter_class=raw,
    )
    ep.add_argument("--install", metavar="PATH", help="write it to PATH (mode 0755)")
    p.set_defaults(func="slurm:cmd_slurm")
