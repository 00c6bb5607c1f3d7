"""Image fan-out: N hosts that lack the image, every host pulling from a
shaped registry (`registry`) against one pull spread host to host (`peers`),
in the same run, on the same sandbox (issue 43). `peers` is the spread
with `container.spread_transport: direct` (host to host, the default);
`relay` the spread with every hop through cvs (`spread_transport: relay`).

    python bench/image_fanout.py                                  # N = 2 4 6, registry + peers
    python bench/image_fanout.py --modes registry peers relay     # the relay too
    python bench/image_fanout.py --sizes 2 4 --modes registry --rounds 1
    python bench/image_fanout.py --smoke --out /tmp/fanout.json   # N = 2, registry, 1 round
    python bench/image_fanout.py --smoke --modes peers            # N = 2, peers, 1 round

Builds one sandbox of max(N) hosts with `cvs sandbox up --registry
--registry-rate RATE` (default 20mbit: the registry's link, not this
machine's cores that every sandbox host shares, is the bottleneck, as on a
real fleet) holding the `--mpi` image (`--image sshd`: the smaller default
one). For every round, N and mode (the modes alternate which goes first
from round to round), on the first N hosts, with `container.distribute:
MODE` in the cluster file:

- time: from the start of `cvs up` until it exits (it exits once every host
  has the image and its container is up; every host's image is checked
  after);
- registry bytes: the tx_bytes delta of REGISTRY_IF inside REGISTRY_NETNS
  (what the registry served; S, the compressed image, is its manifest's
  config and layer sizes);
- host bytes: the tx_bytes delta of each host's eth0 in its namespace
  (what each host sent: to peers, plus its ssh traffic to cvs);
- coordinator: user + system CPU and max RSS of the `cvs up` process
  (wait4);
- the machine: nproc, CPU model, load average before each round.

Between rounds `cvs down --force` and `docker rmi` of the image on every
host: each round starts with no host holding it. `peers` needs the cluster
key `container.distribute`; where this checkout refuses it, the bench says
so and measures `registry` only.

Prints a table (and medians per N and mode); writes every figure as JSON to
`--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.sandbox import Sandbox, sandbox_down, sandbox_up
from orchestrator.sandbox.registry import REGISTRY_USER, image_bytes, netns_registry_dir

REPO = Path(__file__).resolve().parent.parent
MODES = ("registry", "peers", "relay")
DEFAULT_MODES = ("registry", "peers")
# A mode's container keys: `peers` names the direct transport explicitly
# (the figures say what they measured whatever the default).
MODE_KEYS: dict[str, dict[str, str]] = {
    "registry": {"distribute": "registry"},
    "peers": {"distribute": "peers", "spread_transport": "direct"},
    "relay": {"distribute": "peers", "spread_transport": "relay"},
}
CVS_TIMEOUT = 1800.0
LOAD_EVERY = 5.0


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "loadavg": os.getloadavg(),
        "kernel": platform.release(),
    }


def registry_env(sb: Sandbox) -> dict[str, str]:
    pairs = (
        line.removeprefix("export ").split("=", 1)
        for line in sb.registry_env_file.read_text().splitlines()
        if line.startswith("export ")
    )
    return {k: v for k, v in pairs}


def tx_bytes(netns: str, interface: str) -> int:
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "-s", "link", "show", interface],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    link = json.loads(out)[0]
    return int(link.get("stats64", link.get("stats", {}))["tx"]["bytes"])


def variant(source: Path, directory: Path, hosts: int, mode: str | None) -> Path:
    """The sandbox's cluster file on its first `hosts` hosts, with
    `container.distribute: mode` (None: the key left out, for a checkout
    without it, where every host pulls)."""
    doc = yaml.safe_load(source.read_text())
    doc["hosts"] = doc["hosts"][:hosts]
    if mode is not None:
        doc["container"].update(MODE_KEYS[mode])
    path = directory / f"cluster-{hosts}-{mode or 'plain'}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def refused(cluster_file: Path) -> str | None:
    """Why this checkout refuses the cluster file (None: it loads)."""
    from orchestrator.config import load_cluster

    try:
        load_cluster(cluster_file)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return first.split(" (known keys")[0][:200]
    return None


def cvs_env() -> dict[str, str]:
    return {**os.environ, "CI": "1", "PYTHONPATH": str(REPO)}


def cvs(cluster_file: Path, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "orchestrator", "-c", str(cluster_file), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=cvs_env(), timeout=timeout)


def timed_up(cluster_file: Path) -> dict[str, Any]:
    """`cvs up`: wall time to its exit, its CPU (user + sys) and max RSS (wait4)."""
    argv = [sys.executable, "-m", "orchestrator", "-c", str(cluster_file), "up"]
    loads: list[float] = []  # the 1-minute load average, every LOAD_EVERY s while it runs
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=cvs_env())
        deadline = t0 + CVS_TIMEOUT
        next_load = t0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            now = time.perf_counter()
            if now >= next_load:
                loads.append(round(os.getloadavg()[0], 2))
                next_load = now + LOAD_EVERY
            if now > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        tail = out.read()[-3000:].decode(errors="replace")
    return {
        "exit": proc.returncode,
        "s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "maxrss_mib": round(usage.ru_maxrss / 1024, 1),
        "loadavg_during": loads,
        "output_tail": tail if proc.returncode else "",
    }


def has_image(sb: Sandbox, host: str, image: str) -> bool:
    argv = [*sb.docker_argv(host), "images", "-q", image]
    return bool(subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip())


def forget(sb: Sandbox, cluster_file: Path, hosts: list[str], image: str) -> None:
    """Containers down, the image gone from every host: the next round starts cold."""
    cvs(cluster_file, "down", "--force")
    for host in hosts:
        subprocess.run(
            [*sb.docker_argv(host), "rmi", "-f", image], capture_output=True, timeout=120
        )
    left = [h for h in hosts if has_image(sb, h, image)]
    if left:
        raise SystemExit(f"image_fanout: {image} still on {', '.join(left)} after rmi")


def one_round(
    sb: Sandbox, cluster_file: Path, hosts: list[str], mode: str, rnd: int, env: dict[str, str]
) -> dict[str, Any]:
    image = env["REGISTRY_IMAGE"]
    host_ns = {h.name: h.netns for h in sb.nodes}
    load = os.getloadavg()
    reg0 = tx_bytes(env["REGISTRY_NETNS"], env["REGISTRY_IF"])
    sent0 = {h: tx_bytes(str(host_ns[h]), "eth0") for h in hosts}
    up = timed_up(cluster_file)
    reg1 = tx_bytes(env["REGISTRY_NETNS"], env["REGISTRY_IF"])
    sent = {h: tx_bytes(str(host_ns[h]), "eth0") - sent0[h] for h in hosts}
    missing = [h for h in hosts if not has_image(sb, h, image)]
    forget(sb, cluster_file, hosts, image)
    return {
        "hosts": len(hosts),
        "mode": mode,
        "round": rnd,
        **up,
        "all_have_image": not missing and up["exit"] == 0,
        "missing": missing,
        "registry_bytes": reg1 - reg0,
        "host_sent_bytes": sent,
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


@contextmanager
def sandbox(hosts: int, rate: str, mpi: bool) -> Iterator[Sandbox]:
    with tempfile.TemporaryDirectory(prefix="cvs-bench-image-") as tmp:
        directory = Path(tmp) / "sb"
        try:
            yield sandbox_up(
                directory, hosts, registry=True, registry_rate=rate, mpi=mpi, progress=say
            )
        finally:
            sandbox_down(directory)


def commit() -> str:
    """The checkout measured (with `+dirty` when it has uncommitted changes)."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Whole or not at all: a temp file, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


def say(text: str) -> None:
    sys.stderr.write(f"image_fanout: {text}\n")
    sys.stderr.flush()


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def row_text(r: dict[str, Any], size: int) -> str:
    sent = r["host_sent_bytes"].values()
    return (
        f"{r['hosts']:>2}  {r['mode']:<8} {r['round']:>2}  {r['s']:>8.1f}  "
        f"{mb(r['registry_bytes']):>9} {r['registry_bytes'] / size:>5.2f}  "
        f"{mb(max(sent)):>8} {mb(sum(sent)):>9}  {r['cpu_s']:>6.2f} {r['maxrss_mib']:>7.1f}  "
        f"{'ok' if r['all_have_image'] else 'FAILED (exit ' + str(r['exit']) + ')'}\n"
    )


HEADER = (
    f"{'N':>2}  {'mode':<8} {'rd':>2}  {'time s':>8}  {'reg MB':>9} {'x S':>5}  "
    f"{'host MB':>8} {'hosts MB':>9}  {'cpu s':>6} {'rss MiB':>7}\n"
    f"{'':>44}{'(max)':>8} {'(sum)':>9}\n"
)


def summary(results: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    out = []
    for n in sorted({r["hosts"] for r in results}):
        for mode in MODES:
            rs = [r for r in results if r["hosts"] == n and r["mode"] == mode]
            if not rs:
                continue
            out.append(
                {
                    "hosts": n,
                    "mode": mode,
                    "rounds": len(rs),
                    "ok": all(r["all_have_image"] for r in rs),
                    "s_median": statistics.median(r["s"] for r in rs),
                    "s_min": min(r["s"] for r in rs),
                    "s_max": max(r["s"] for r in rs),
                    "registry_x_s_median": round(
                        statistics.median(r["registry_bytes"] for r in rs) / size, 3
                    ),
                    "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
                    "maxrss_mib_max": max(r["maxrss_mib"] for r in rs),
                }
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 6], help="hosts (N)")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        help="default: registry peers (--smoke: registry)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", default="20mbit", help="the registry's link (tc tbf rate)")
    parser.add_argument(
        "--image", choices=["mpi", "sshd"], default="mpi", help="the sandbox image pushed"
    )
    parser.add_argument("--out", type=Path, default=Path("image_fanout.json"), help="JSON file")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="N = 2, 1 round, sshd image, 1gbit (the mode: --modes, else registry)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.rounds, args.image, args.rate = [2], 1, "sshd", "1gbit"
        args.modes = args.modes or ["registry"]
    args.modes = args.modes or list(DEFAULT_MODES)
    if os.geteuid() != 0:
        raise SystemExit("image_fanout: the sandbox needs root")
    notes: list[str] = []
    results: list[dict[str, Any]] = []
    started = machine()
    with ExitStack() as stack:
        sb = stack.enter_context(sandbox(max(args.sizes), args.rate, args.image == "mpi"))
        env = registry_env(sb)
        password = (netns_registry_dir(sb.run_dir) / "password").read_text().strip()
        size = image_bytes(env["REGISTRY_IMAGE"], REGISTRY_USER, password)
        say(f"{env['REGISTRY_IMAGE']}: {mb(size)} MB compressed (S), registry at {args.rate}")
        # Gone on every exit, Ctrl-C included (the sandbox's own directory is too).
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cvs-bench-work-")))
        modes = list(args.modes)
        # `registry` is set explicitly where the key exists (its default,
        # auto, would spread); a checkout without the key pulls everywhere.
        why = refused(variant(sb.cluster_file, work, min(args.sizes), "registry"))
        key = why is None
        if not key:
            notes.append(
                f"container.distribute is refused here ({why}): `registry` runs leave it out "
                "(every host pulls)"
            )
            say(notes[-1])
        for spread in [m for m in modes if m != "registry"]:
            why = refused(variant(sb.cluster_file, work, min(args.sizes), spread))
            if why is not None:
                modes.remove(spread)
                notes.append(
                    f"{spread} mode unavailable: this checkout refuses {MODE_KEYS[spread]} "
                    f"({why}); not measured"
                )
                say(notes[-1])
        head: dict[str, Any] = {
            "what": "image_fanout",
            "image": env["REGISTRY_IMAGE"],
            "image_bytes": size,
            "rate": args.rate,
            "sizes": args.sizes,
            "modes": modes,
            "rounds": args.rounds,
            "machine": started,
            "commit": commit(),
            "notes": notes,
        }
        sys.stdout.write(HEADER)
        for rnd in range(1, args.rounds + 1):
            # Who goes first alternates per round (a shared machine drifts).
            order = modes if rnd % 2 else list(reversed(modes))
            for n in args.sizes:
                hosts = [h.name for h in sb.nodes[:n]]
                for mode in order:
                    cluster_file = variant(sb.cluster_file, work, n, mode if key else None)
                    r = one_round(sb, cluster_file, hosts, mode, rnd, env)
                    results.append(r)
                    sys.stdout.write(row_text(r, size))
                    sys.stdout.flush()
                    # Every row as it comes: a run cut short keeps what it measured.
                    write_report(args.out, {**head, "results": results})
    medians = summary(results, size)
    sys.stdout.write("\nmedians:\n")
    for m in medians:
        sys.stdout.write(
            f"{m['hosts']:>2}  {m['mode']:<8} {m['s_median']:.1f} s "
            f"({m['s_min']:.1f}..{m['s_max']:.1f}, "
            f"{m['rounds']} rounds), registry {m['registry_x_s_median']:.2f} x S, cvs CPU "
            f"{m['cpu_s_median']:.2f} s, RSS {m['maxrss_mib_max']:.1f} MiB"
            f"{'' if m['ok'] else ', FAILED rounds'}\n"
        )
    for note in notes:
        sys.stdout.write(f"note: {note}\n")
    write_report(
        args.out,
        {**head, "loadavg_after": os.getloadavg(), "results": results, "medians": medians},
    )
    sys.stdout.write(f"wrote {args.out}\n")
    return 0 if all(r["all_have_image"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
