"""Suites: the suite-file model, the runner, run records; built-in demo suites as data."""
