"""Example tests a suite driver writes with the pytest plugin (shipped as documentation)."""
