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
import re
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


# -- the shaped registry's own namespace (`cvs sandbox up --registry`) --------

# Hosts take .1-.250, the bridge .254: .253 is the registry's.
REGISTRY_HOST_NUMBER = 253
# The registry's side of its veth: what `tx_bytes` counts is what it served.
REGISTRY_INTERFACE = "eth0"
# A tc rate as `tbf` reads it, in bits per second (no bytes-per-second units:
# one spelling, no `mbit`/`mbps` mix-up).
RATE_PATTERN = re.compile(r"[1-9][0-9]{0,9}(k|m|g)?bit")


def registry_netns_name(index: int) -> str:
    return f"cvs{index}-registry"


def registry_veth_name(index: int) -> str:
    return f"cvs{index}reg"


def registry_address(index: int) -> str:
    return host_address(index, REGISTRY_HOST_NUMBER)


def check_rate(rate: str) -> str:
    """`rate` if it full-matches RATE_PATTERN (e.g. 20mbit), else SandboxError."""
    if not RATE_PATTERN.fullmatch(rate):
        raise SandboxError(
            f"--registry-rate {rate!r} is not a rate: write digits and bit, kbit, mbit or "
            "gbit (e.g. 20mbit)"
        )
    return rate


def create_registry_netns(index: int, rate: str | None) -> None:
    """The registry's namespace on the sandbox bridge at registry_address(index);
    with `rate`, its egress interface shaped to it (tbf)."""
    ns = registry_netns_name(index)
    veth = registry_veth_name(index)
    run(["ip", "netns", "add", ns])
    peer = ["peer", "name", REGISTRY_INTERFACE, "netns", ns]
    run(["ip", "link", "add", veth, "type", "veth", *peer])
    run(["ip", "link", "set", veth, "master", bridge_name(index)])
    run(["ip", "link", "set", veth, "up"])
    inside = ["ip", "-n", ns]
    run([*inside, "link", "set", "lo", "up"])
    run([*inside, "addr", "add", f"{registry_address(index)}/24", "dev", REGISTRY_INTERFACE])
    run([*inside, "link", "set", REGISTRY_INTERFACE, "up"])
    if rate is not None:
        # What the registry sends leaves by its own eth0: shaping it there shapes
        # what it serves and nothing else (DESIGN.md, "Moving an image").
        run(
            ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", REGISTRY_INTERFACE,
             "root", "tbf", "rate", check_rate(rate), "burst", "64kb", "latency", "50ms"]
        )  # fmt: skip
