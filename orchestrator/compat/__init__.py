"""CVS compatibility: CVS's own pytest suites, unchanged, on this engine.

    compat/config.py        CVS cluster JSON + test config JSON -> ClusterConfig
    compat/shapes.py        PURE: HostResult -> CVS's result shapes; the mpirun line
    compat/loop.py          one event loop in a thread, for CVS's synchronous API
    compat/cvs.py           CvsOrchestrator: CVS's orchestrator surface on `Cluster`
    compat/records.py       the run directory of a CVS suite run
    compat/pytest_engine.py the pytest side: swap CVS's factory for ours (opt-in)
    compat/runner.py        `cvs run TEST --cluster_file C --config_file T`

A layer above api/sync/suites and below pytest_plugin/cli.
"""
