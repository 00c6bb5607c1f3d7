"""Stand-in GPU device roots for tests on the sandbox: /dev/kfd, renderD nodes
and the sysfs entries the discovery script reads, in a temp directory.

Not a test module (test modules import it, it imports none).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# PCI vendor IDs as sysfs writes them.
AMD, NVIDIA = "0x1002", "0x10de"


def make_device_root(render_vendors: dict[int, str]) -> Path:
    """A device root with /dev/kfd, the given renderD<minor> nodes, and sysfs
    entries giving each node a PCI address and vendor. World-readable: the
    sandbox's login user runs the discovery script."""
    root = Path(tempfile.mkdtemp(prefix="cvs-gpu-root-", dir="/tmp"))
    root.chmod(0o755)
    (root / "dev" / "dri").mkdir(parents=True)
    os.mknod(root / "dev" / "kfd", 0o666 | 0o020000, os.makedev(1, 3))
    for index, (minor, vendor) in enumerate(sorted(render_vendors.items())):
        os.mknod(root / "dev" / "dri" / f"renderD{minor}", 0o666 | 0o020000, os.makedev(1, 3))
        bdf = f"0000:{0xC1 + index:02x}:00.0"
        device = root / "sys" / "devices" / "pci0000:00" / bdf
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        drm = root / "sys" / "class" / "drm" / f"renderD{minor}"
        drm.mkdir(parents=True)
        (drm / "device").symlink_to(os.path.relpath(device, drm))
    return root
