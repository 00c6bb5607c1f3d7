"""Stand-in for the part of cvs.lib.utils_lib that OrchestratorConfig uses."""

import getpass


def resolve_cluster_config_placeholders(value):
    """Replace {user-id} with the current user, recursively."""
    if isinstance(value, str):
        return value.replace("{user-id}", getpass.getuser())
    if isinstance(value, dict):
        return {k: resolve_cluster_config_placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_cluster_config_placeholders(v) for v in value]
    return value
