"""cvs-orchestrator: keep one named test container per GPU host in the state a run needs."""

__version__ = "0.1.0"
