"""`cvs completion bash|zsh`: the completion script, generated from the parser by shtab."""

from __future__ import annotations

import argparse
import sys

from orchestrator.cli.parser import build_parser
from orchestrator.errors import ExitCode, UsageError

# Host names for HOST, --hosts and -x, from the cluster file the line names with -c
# (else $CVS_CLUSTER, else ./cluster.yaml), read by `cvs validate --json`.
_NAMES = (
    "python3 -c 'import json,sys; "
    '[print(h["name"]) for h in json.load(sys.stdin).get("cluster", {}).get("hosts", [])]\''
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
"""


def completion_script(shell: str) -> str:
    try:
        import shtab
    except ImportError:  # a dependency, but say so plainly if it went missing
        raise UsageError("cvs completion: needs the shtab package (pip install shtab)") from None
    preamble = BASH_PREAMBLE if shell == "bash" else ZSH_PREAMBLE
    return str(shtab.complete(build_parser(), shell=shell, preamble=preamble))


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(args.shell))
    return ExitCode.OK
