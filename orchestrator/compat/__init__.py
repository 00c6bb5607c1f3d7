"""CVS compatibility: CVS's own pytest suites, unchanged, on this engine.

    compat/config.py        CVS cluster JSON + test config JSON -> ClusterConfig
    compat/shapes.py        PURE: HostResult -> CVS's result shapes; the mpirun line
    compat/loop.py          one event loop in a thread, for CVS's synchronous API
    compat/logs.py          asyncssh's INFO chatter as DEBUG under CVS's live logging
    compat/cvs.py           CvsOrchestrator: CVS's orchestrator surface on `Cluster`
    compat/records.py       the run directory of a CVS suite run
    compat/pytest_engine.py the pytest side: swap CVS's factory for ours (opt-in)
    compat/runner.py        `cvs run TEST --cluster_file C --config_file T`: checks, then
    compat/pytest_child.py  pytest in a child interpreter with nothing of ours loaded

A layer above api/sync/suites and below pytest_plugin/cli.
"""
