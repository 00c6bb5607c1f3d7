"""Stand-in for cvs.core.orchestrators.factory, in the shape of CVS's.

`OrchestratorConfig.from_configs` merges the two JSON files the way CVS does
(the test config wins per top-level key, then {user-id} is resolved) and
keeps only the keys an orchestrator gets. `OrchestratorFactory` has CVS's
signature but no backends: reaching it means the engine swap did not happen.
"""

import json

from cvs.lib.utils_lib import resolve_cluster_config_placeholders


class OrchestratorConfig:
    def __init__(self, **kwargs):
        required = ("orchestrator", "node_dict", "username", "priv_key_file")
        missing = [k for k in required if k not in kwargs]
        if missing:
            raise ValueError(f"OrchestratorConfig missing required keys: {missing}")
        self.orchestrator = kwargs["orchestrator"]
        self.node_dict = kwargs["node_dict"]
        self.username = kwargs["username"]
        self.priv_key_file = kwargs["priv_key_file"]
        self.password = kwargs.get("password")
        self.head_node_dict = kwargs.get("head_node_dict", {})
        self.container = kwargs.get("container", {})

    def get(self, key, default=None):
        return getattr(self, key, default)

    @classmethod
    def from_configs(cls, cluster_config, testsuite_config=None):
        if isinstance(cluster_config, str):
            with open(cluster_config) as f:
                cluster_config = json.load(f)
        if isinstance(testsuite_config, str):
            with open(testsuite_config) as f:
                testsuite_config = json.load(f)
        merged = cluster_config.copy()
        if testsuite_config:
            merged.update(testsuite_config)
        merged = resolve_cluster_config_placeholders(merged)
        required = {
            "orchestrator": merged.get("orchestrator", "baremetal"),
            "node_dict": merged.get("node_dict"),
            "username": merged.get("username"),
            "priv_key_file": merged.get("priv_key_file"),
            "password": merged.get("password"),
            "head_node_dict": merged.get("head_node_dict", {}),
            "container": merged.get("container", {}),
        }
        for key in ("node_dict", "username", "priv_key_file"):
            if required[key] is None:
                raise ValueError(f"{key} must be provided in configuration")
        return cls(**required)


class OrchestratorFactory:
    @staticmethod
    def create_orchestrator(log, config, stop_on_errors=False):
        if not isinstance(config, OrchestratorConfig):
            raise TypeError("config must be OrchestratorConfig instance")
        raise RuntimeError(
            f"stand-in CVS has no {config.orchestrator!r} backend: run with "
            "--cvs-orchestrator (or CVS_ENGINE=cvs-orchestrator)"
        )

    @staticmethod
    def get_supported_backends():
        return ["baremetal", "container"]
