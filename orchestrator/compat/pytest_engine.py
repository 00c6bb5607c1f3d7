"""The pytest side: with `--cvs-orchestrator` (or `CVS_ENGINE=cvs-orchestrator`),
CVS's `OrchestratorFactory.create_orchestrator` returns our `CvsOrchestrator`
for the session, so CVS's own conftest.py and suites run as they are.

Registered from `orchestrator.pytest_plugin`; `cvs run TEST` registers a
`CvsEngine` itself (with a run record). Nothing changes unless asked for.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .cvs import CvsOrchestrator
    from .records import CvsRunRecord

ENGINE_NAME = "cvs-orchestrator"
ENGINE_ENV = "CVS_ENGINE"
FACTORY_MODULE = "cvs.core.orchestrators.factory"
PLUGIN_NAME = "cvs-orchestrator-engine"
# Namespaced, option and internal name both: pytest 9.2 refuses a second option
# whose internal name another plugin or conftest took (CVS's conftest swallows
# that error and loses its own option).
ENGINE_OPTION = "--cvs-orchestrator"
ENGINE_DEST = "cvs_orchestrator_engine"


def add_engine_option(group: Any) -> None:
    group.addoption(
        ENGINE_OPTION,
        action="store_true",
        dest=ENGINE_DEST,
        default=False,
        help=f"run CVS's suites on cvs-orchestrator (also: {ENGINE_ENV}={ENGINE_NAME}; "
        "without either, CVS's own orchestrators)",
    )


def engine_requested(config: pytest.Config) -> bool:
    if config.getoption(ENGINE_DEST, False):
        return True
    # Another value may name a backend for CVS's own entry-point lookup: not ours.
    return os.environ.get(ENGINE_ENV) == ENGINE_NAME


def configure(config: pytest.Config) -> None:
    """Called from the plugin's pytest_configure: register the engine when opted in."""
    if not engine_requested(config):
        return
    if any(isinstance(p, CvsEngine) for p in config.pluginmanager.get_plugins()):
        return  # `cvs run` registered one already
    config.pluginmanager.register(CvsEngine(own_record=True), PLUGIN_NAME)


def _session_record(config: pytest.Config, cluster_file: str | None) -> CvsRunRecord:
    """`runs/<UTC time>-<test module>/` in the working directory, as `cvs run` writes."""
    from orchestrator.suites.records import RunRecorder, default_run_dir

    from .records import CvsRunRecord

    files = [a.split("::")[0] for a in config.args if a.split("::")[0].endswith(".py")]
    stem = Path(files[0]).stem if files else "pytest"
    recorder = RunRecorder.create(default_run_dir(stem), unique=True)
    return CvsRunRecord(
        recorder,
        test=stem,
        test_file=os.path.abspath(files[0]) if files else "",
        cluster_file=os.path.abspath(cluster_file) if cluster_file else "",
    )


class CvsEngine:
    """Swaps CVS's factory for the session; closes what it made at the end."""

    def __init__(
        self,
        record: CvsRunRecord | None = None,
        *,
        own_record: bool = False,
        record_factory: Callable[[pytest.Config], CvsRunRecord] | None = None,
    ) -> None:
        # `cvs run` passes its record, or a factory for it (called once pytest has
        # read its configuration: making a record imports our SSH stack), and
        # finishes it; opted in from pytest, the engine makes and finishes its own.
        self.record = record
        self._record_factory = record_factory
        self._own_record = own_record and record is None and record_factory is None
        self.cluster_file: str | None = None
        self.created: list[CvsOrchestrator] = []
        self._factory: Any = None
        self._original: Any = None

    def pytest_configure(self, config: pytest.Config) -> None:
        try:
            module = importlib.import_module(FACTORY_MODULE)
        except ImportError as exc:
            raise pytest.UsageError(
                f"{ENGINE_OPTION}: cannot import {FACTORY_MODULE} ({exc}); "
                "install CVS in this environment"
            ) from None
        self.cluster_file = config.getoption("cluster_file", None)
        self._factory = module.OrchestratorFactory
        self._original = self._factory.__dict__.get("create_orchestrator")
        self._factory.create_orchestrator = staticmethod(self.create_orchestrator)
        if self._own_record:
            self.record = _session_record(config, self.cluster_file)
        elif self.record is None and self._record_factory is not None:
            self.record = self._record_factory(config)

    def create_orchestrator(
        self, log: Any, config: Any, stop_on_errors: bool = False
    ) -> CvsOrchestrator:
        from .cvs import CvsOrchestrator

        orch = CvsOrchestrator(
            log, config, stop_on_errors, cluster_file=self.cluster_file, record=self.record
        )
        self.created.append(orch)
        return orch

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.record is not None:
            self.record.current_test = item.name

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.record is not None and (report.when == "call" or report.outcome != "passed"):
            self.record.add_test(report.nodeid, report.when, report.outcome)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._own_record and self.record is not None:
            run_dir = self.record.recorder.run_dir
            terminalreporter.write_line(f"cvs-orchestrator run records: {run_dir}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._own_record and self.record is not None:
            from .records import finish_with_pytest_status

            for orch in self.created:
                orch.close()  # the last events are in before the record closes
            finish_with_pytest_status(self.record, int(exitstatus))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        for orch in self.created:
            orch.close()
        if self._factory is not None and self._original is not None:
            self._factory.create_orchestrator = self._original
