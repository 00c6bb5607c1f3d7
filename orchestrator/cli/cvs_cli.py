"""One `cvs` for both projects: CVS's own subcommands go to CVS's CLI, unchanged.

AMD's CVS installs a `cvs` command too (`cvs.main:main`); in one environment
the package installed last owns `bin/cvs`. So that a CVS user who installs
this project keeps every CVS command, the forms this project does not
implement are handed to CVS's own CLI with the arguments exactly as typed
(the process is replaced: CVS's exit code, output and signals are its own):

    cvs list | generate | monitor | copy-config | scp ...   CVS's commands
    cvs exec --cmd CMD ...                                  CVS's exec form
    cvs EXT-COMMAND ...                                     a subcommand of a CVS
                                                            extension (cvs.cli_plugins)

Ours keeps its own commands (`cvs run`, `cvs exec CMD`, `cvs up`...); `cvs run
TEST --cluster_file C --config_file T` is ours and runs CVS's test on our
engine. Without CVS importable, nothing is handed over. Decided before our
parser runs, from the first word alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from collections.abc import Sequence

CVS_MAIN = "cvs.main"
# CVS's subcommands that this project has no command of its own for.
CVS_ONLY_COMMANDS = ("list", "generate", "monitor", "copy-config", "scp")


def cvs_importable() -> bool:
    try:
        return importlib.util.find_spec(CVS_MAIN) is not None
    except (ImportError, ValueError):
        return False


def _cvs_plugin_exists(command: str) -> bool:
    name = command.replace("-", "_")
    if not name.isidentifier():
        return False
    try:
        return importlib.util.find_spec(f"cvs.cli_plugins.{name}_plugin") is not None
    except (ImportError, ValueError):
        return False


def wants_cvs_cli(argv: Sequence[str], ours: Sequence[str]) -> bool:
    """Whether these arguments are a CVS command form that this project does not have.

    PURE but for the import probes: the first word decides (CVS's CLI has no
    global options but --version and --help, which are ours)."""
    if not argv or argv[0].startswith("-"):
        return False
    command = argv[0]
    if command == "exec":
        return any(a == "--cmd" or a.startswith("--cmd=") for a in argv[1:])
    if command in ours:
        return False
    return command in CVS_ONLY_COMMANDS or _cvs_plugin_exists(command)


def exec_cvs_cli(argv: Sequence[str]) -> None:
    """Replace this process with CVS's own CLI, given `argv` unchanged."""
    sys.stdout.flush()
    sys.stderr.flush()
    program = "import sys; sys.argv[0] = 'cvs'; from cvs.main import main; main()"
    os.execv(sys.executable, [sys.executable, "-c", program, *argv])


def help_epilog() -> str:
    """What `cvs --help` adds when CVS is installed here too."""
    return textwrap.fill(
        "CVS is installed here too: these go to CVS's own CLI, unchanged: "
        f"{', '.join(CVS_ONLY_COMMANDS)}, `exec --cmd CMD` (and CVS extensions' "
        "commands). `run TEST --cluster_file C --config_file T` runs a CVS test on this "
        "engine; the commands listed above are this project's. `python -m cvs.main ...` "
        "is always CVS's.",
        width=79,
    )
