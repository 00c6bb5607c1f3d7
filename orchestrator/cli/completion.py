"""`cvs completion bash|zsh`: the completion script, generated from the parser by shtab."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from orchestrator.cli.common import write_json_result
from orchestrator.cli.parser import build_parser
from orchestrator.errors import ExitCode, UsageError

shtab: ModuleType | None
try:
    import shtab
except ImportError:  # a dependency, but said plainly if it went missing (completion_script)
    shtab = None


# Host names for HOST, --hosts and -x, from the cluster file the line names with -c
# (else $CVS_CLUSTER, else ./cluster.yaml), read by `cvs validate --json`.
_NAMES = (
    "python3 -c 'import json,sys; "
    '[print(h["name"]) for h in json.load(sys.stdin).get("cluster", {}).get("hosts", [])]\''
)

# Suite names for `cvs run SUITE`, from `cvs run --list --json` (./suites,
# $CVS_SUITES_PATH, the shipped examples: what `cvs run` would find).
_SUITES = (
    "python3 -c 'import json,sys; "
    '[print(s["name"]) for s in json.load(sys.stdin).get("suites", [])]\''
)

BASH_PREAMBLE = f"""
_cvs_hosts() {{
  local i cluster=""
  for ((i=1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      -c|--cluster) cluster="${{COMP_WORDS[i+1]}}" ;;
      --cluster=*) cluster="${{COMP_WORDS[i]#--cluster=}}" ;;
    esac
  done
  compgen -W "$(cvs ${{cluster:+-c "$cluster"}} validate --no-check-files --json 2>/dev/null \
    | {_NAMES} 2>/dev/null)" -- "$1"
}}

_cvs_suites() {{
  compgen -W "$(cvs run --list --json 2>/dev/null | {_SUITES} 2>/dev/null)" -- "$1"
}}

# Run IDs for `cvs runs show RUN`: the run directories under --dir (default ./runs).
_cvs_runs() {{
  local i dir=runs
  for ((i=1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      --dir) dir="${{COMP_WORDS[i+1]}}" ;;
      --dir=*) dir="${{COMP_WORDS[i]#--dir=}}" ;;
    esac
  done
  compgen -W "latest $(cd "$dir" 2>/dev/null && ls -1d -- */ 2>/dev/null | tr -d /)" -- "$1"
}}
"""

ZSH_PREAMBLE = f"""
_cvs_hosts() {{
  local i cluster=""
  for ((i=2; i < CURRENT; i++)); do
    case "${{words[i]}}" in
      -c|--cluster) cluster="${{words[i+1]}}" ;;
      --cluster=*) cluster="${{words[i]#--cluster=}}" ;;
    esac
  done
  local -a hosts
  hosts=(${{(f)"$(cvs ${{cluster:+-c "$cluster"}} validate --no-check-files --json 2>/dev/null \
    | {_NAMES} 2>/dev/null)"}})
  compadd -a hosts
}}

_cvs_suites() {{
  local -a suites
  suites=(${{(f)"$(cvs run --list --json 2>/dev/null | {_SUITES} 2>/dev/null)"}})
  compadd -a suites
}}

_cvs_runs() {{
  local i dir=runs
  for ((i=2; i < CURRENT; i++)); do
    case "${{words[i]}}" in
      --dir) dir="${{words[i+1]}}" ;;
      --dir=*) dir="${{words[i]#--dir=}}" ;;
    esac
  done
  local -a runs
  runs=(latest ${{(f)"$(cd "$dir" 2>/dev/null && ls -1d -- */ 2>/dev/null | tr -d /)"}})
  compadd -a runs
}}
"""


def completion_script(shell: str) -> str:
    if shtab is None:  # a dependency, but say so plainly if it went missing
        raise UsageError("cvs completion: needs the shtab package (pip install shtab)")
    preamble = BASH_PREAMBLE if shell == "bash" else ZSH_PREAMBLE
    return str(shtab.complete(build_parser(), shell=shell, preamble=preamble))


def cmd_completion(args: argparse.Namespace) -> int:
    script = completion_script(args.shell)
    if getattr(args, "json", False):
        # JSON lines on stdout for every command: the script is the result's.
        write_json_result(args, ok=True, exit_code=ExitCode.OK, shell=args.shell, script=script)
    else:
        sys.stdout.write(script)
    return ExitCode.OK
