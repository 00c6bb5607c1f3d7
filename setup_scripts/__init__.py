"""The default setup script(s), shipped inside the package as orchestrator.setup_scripts."""
