"""Stand-in for cvs/tests/conftest.py: CVS's module-scoped `orch` fixture, same shape."""

import pytest

from cvs.core.orchestrators.factory import OrchestratorConfig, OrchestratorFactory
from cvs.lib import globals

log = globals.log


@pytest.fixture(scope="module")
def orch(pytestconfig):
    cluster_file = pytestconfig.getoption("cluster_file")
    config_file = pytestconfig.getoption("config_file")
    if not cluster_file or not config_file:
        pytest.fail("orch fixture requires --cluster_file and --config_file")

    cfg = OrchestratorConfig.from_configs(cluster_file, config_file)
    orch = OrchestratorFactory.create_orchestrator(log, cfg)

    if cfg.orchestrator == "container":
        if not orch.setup_containers():
            pytest.fail(
                f"Failed to launch container : "
                f"{orch.get_container_name(orch.container_config, orch.container_config['image'])}"
            )
        if not orch.setup_sshd():
            pytest.fail("Failed to setup sshd in container")

    yield orch

    if cfg.orchestrator == "container":
        orch.teardown_containers()
