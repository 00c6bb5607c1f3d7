"""What tests feed the scripted hosts (orchestrator/testing.py, the package's
`ScriptedHosts`): the probe's output for a host in a given state.

Not a test module: tests import it as they import private_dockerd.
"""

from __future__ import annotations

import json

from orchestrator.testing import ScriptedHosts

__all__ = ["IMAGE_ID", "ScriptedHosts", "probe_output"]

IMAGE_ID = "sha256:" + "a" * 64


def probe_output(
    name: str = "ctr",
    image: str = "img:1",
    *,
    image_id: str | None = IMAGE_ID,
    cpus: int = 8,
    memory_kb: int = 64 * 1024 * 1024,
) -> str:
    """What remote/probe.sh prints for a host where container `name` is
    absent and `image` resolves to `image_id` (None: not on the host)."""
    objects, errors = [], [f"Error: No such object: {name}"]
    if image_id is not None:
        objects.append(json.dumps({"Id": image_id, "RepoDigests": [], "RootFS": {}}))
    else:
        errors.append(f"Error: No such object: {image}")
    return "".join(
        [
            "@@cvs:probe 3\n",
            f"@@cvs:args {name} {image}\n",
            f"@@cvs:capacity {cpus} {memory_kb}\n",
            "@@cvs:section inspect.direct 1 raw\n",
            *(f"J {o}\n" for o in objects),
            *(f"E {e}\n" for e in errors),
            "@@cvs:end inspect.direct\n",
            "@@cvs:facts - - no\n",
            "@@cvs:done\n",
        ]
    )
