"""Stand-in for cvs.extension: the part of CVS's extension discovery that
`cvs run` reads, `ExtensionConfig().get_tests_dirs()`.

CVS gathers extension package names from several places (entry points in the
`cvs.extensions` group, a per-venv plug-list, $CVS_EXTENSION_PKG_NAMES, an
extension.ini bundled into cvs); this stand-in knows only the environment
variable. Each named package's own `extension.ini` lists its test directories
under `[extensions] tests_dirs`, comma-separated, relative to the directory
that holds the package, as in CVS.
"""

import configparser
import importlib.util
import os


class ExtensionConfig:
    def __init__(self):
        self._dirs = []
        names = os.environ.get("CVS_EXTENSION_PKG_NAMES", "")
        for name in (n.strip() for n in names.split(",")):
            if not name or name == "cvs":
                continue
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                continue
            package_dir = os.path.dirname(spec.origin)
            ini = configparser.ConfigParser()
            ini.read(os.path.join(package_dir, "extension.ini"))
            listed = ini.get("extensions", "tests_dirs", fallback="")
            for rel in (d.strip() for d in listed.split(",")):
                if rel:
                    where = os.path.join(os.path.dirname(package_dir), rel)
                    self._dirs.append((name, rel.replace("/", "."), where))

    def get_tests_dirs(self):
        """(extension, module path, directory) for each extension test directory."""
        return list(self._dirs)
