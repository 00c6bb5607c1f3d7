"""An install suite in the shape of CVS's (install_rvs, install_agfhc, ...).

Installs a tool, a setup-env script and a minimal `mpirun` into the
containers; with `lifetime: persistent` they are still there for the next
`cvs run` (compat_checks.py).
"""

import json

import pytest

# A minimal mpirun: --np N --hostfile F [-x K=V ...] CMD...; one ssh per rank,
# container to container, over the ssh config cvs-orchestrator provisions.
MPIRUN = r"""#!/bin/bash
np=1 hostfile= envs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --np|-np|-n) np=$2; shift 2 ;;
    --hostfile) hostfile=$2; shift 2 ;;
    --allow-run-as-root) shift ;;
    -x) envs+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
rank=0 pids=()
while read -r host slots; do
  n=${slots#slots=}
  for ((i = 0; i < n && rank < np; i++, rank++)); do
    ssh -n "$host" "$(printf '%q ' env "${envs[@]}" "RANK=$rank" "$@")" &
    pids+=($!)
  done
done < "$hostfile"
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
"""


@pytest.fixture(scope="module")
def config_dict(pytestconfig):
    with open(pytestconfig.getoption("config_file")) as f:
        return json.load(f)["compat"]


def test_install_tool(orch, config_dict):
    token = config_dict["token"]
    cmd = (
        "mkdir -p /opt/compat/bin /opt/compat/mpi/bin && "
        f"echo {token} > /opt/compat/token && "
        "printf '#!/bin/sh\\necho compat-tool ok\\n' > /opt/compat/bin/compat-tool && "
        "chmod +x /opt/compat/bin/compat-tool && "
        "printf '#!/bin/bash\\ntest -x /opt/compat/bin/compat-tool\\n' > /opt/compat/env.sh && "
        f"cat > /opt/compat/mpi/bin/mpirun <<'EOF'\n{MPIRUN}EOF\n"
        "chmod +x /opt/compat/mpi/bin/mpirun"
    )
    out = orch.exec(cmd, detailed=True, timeout=60)
    assert set(out) == set(orch.hosts)
    for host, result in out.items():
        assert result["exit_code"] == 0, f"{host}: {result['output']}"


def test_each_host_records_its_name(orch):
    # exec_cmd_list: cmd_list[i] runs on hosts[i]
    out = orch.exec_cmd_list([f"echo {h} > /opt/compat/whoami" for h in orch.hosts])
    assert set(out) == set(orch.hosts)
    check = orch.exec("cat /opt/compat/whoami")
    assert {h: o.strip() for h, o in check.items()} == {h: h for h in orch.hosts}
