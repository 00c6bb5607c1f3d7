"""Stand-in for cvs/conftest.py: the two options every CVS suite takes."""

import contextlib


def pytest_addoption(parser):
    for name, text in (
        ("--cluster_file", "Input file with all the details of the cluster in JSON format"),
        ("--config_file", "Input file with all configurations for tests in JSON format"),
    ):
        with contextlib.suppress(ValueError):  # already added
            parser.addoption(name, action="store", default=None, help=text)
