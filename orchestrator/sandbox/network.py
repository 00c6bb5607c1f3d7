"""Bridge, network namespaces and veth pairs for the sandbox hosts.

Each sandbox instance K gets bridge `cvsbrK` holding 10.201.K.254/24 in the
root namespace and one namespace per host with eth0 = 10.201.K.i/24. There is
deliberately no default route in the namespaces and no NAT: a sandbox host
can reach the root namespace and its siblings, nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

from .errors import SandboxError
from .procs import run

SUBNET_PREFIX = "10.201"
RUN_ROOT = Path("/run/cvs-sandbox")
NETNS_DIR = Path("/var/run/netns")


def bridge_name(index: int) -> str:
    return f"cvsbr{index}"


def netns_name(index: int, host: str) -> str:
    return f"cvs{index}-{host}"


def veth_name(index: int, host_number: int) -> str:
    # Interface names are capped at 15 characters.
    return f"cvs{index}h{host_number}"


def host_address(index: int, host_number: int) -> str:
    return f"{SUBNET_PREFIX}.{index}.{host_number}"


def gateway_address(index: int) -> str:
    return f"{SUBNET_PREFIX}.{index}.254"


@contextlib.contextmanager
def global_lock() -> Iterator[None]:
    """Serialize index allocation and user creation across concurrent `up`s."""
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    RUN_ROOT.chmod(0o755)
    with open(RUN_ROOT / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _addresses_in_use() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = run(["ip", "-j", "-4", "addr", "show"])
    nets: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for link in json.loads(out or "[]"):
        for info in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                nets.add(ipaddress.ip_interface(f"{info['local']}/{info['prefixlen']}").network)
    return nets


def claim_index() -> int:
    """Pick a free K (1..250) and claim it with RUN_ROOT/K. Call under `global_lock`."""
    in_use = _addresses_in_use()
    # Round-robin from the last claim rather than lowest-free: a sandbox just
    # torn down does not hand its subnet (and stale host keys / observers of
    # its paths) straight to the next one.
    cursor = RUN_ROOT / ".next"
    try:
        start = int(cursor.read_text())
    except (OSError, ValueError):
        start = 1
    start = start if 1 <= start <= 250 else 1
    index: int
    for index in [*range(start, 251), *range(1, start)]:
        subnet = ipaddress.ip_network(f"{SUBNET_PREFIX}.{index}.0/24")
        claim = RUN_ROOT / str(index)
        if claim.exists() or link_exists(bridge_name(index)):
            continue
        if any(subnet.overlaps(net) for net in in_use):
            continue
        claim.mkdir(mode=0o755)
        claim.chmod(0o755)
        cursor.write_text(f"{index % 250 + 1}\n")
        return index
    raise SandboxError("no free sandbox subnet in 10.201.1-250.0/24; run `cvs sandbox down`")


def create_bridge(index: int) -> None:
    name = bridge_name(index)
    run(["ip", "link", "add", name, "type", "bridge"])
    run(["ip", "addr", "add", f"{gateway_address(index)}/24", "dev", name])
    run(["ip", "link", "set", name, "up"])


def create_host_netns(index: int, host: str, host_number: int) -> None:
    ns = netns_name(index, host)
    veth = veth_name(index, host_number)
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", veth, "master", bridge_name(index)])
    run(["ip", "link", "set", veth, "up"])
    inside = ["ip", "-n", ns]
    run([*inside, "link", "set", "lo", "up"])
    run([*inside, "addr", "add", f"{host_address(index, host_number)}/24", "dev", "eth0"])
    run([*inside, "link", "set", "eth0", "up"])


def delete_link(name: str) -> None:
    # A veth vanishes with its peer's namespace, so it may be gone by now.
    if link_exists(name):
        try:
            run(["ip", "link", "del", name])
        except subprocess.CalledProcessError:
            if link_exists(name):
                raise


def delete_netns(name: str) -> None:
    if (NETNS_DIR / name).exists():
        run(["ip", "netns", "del", name])


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()
