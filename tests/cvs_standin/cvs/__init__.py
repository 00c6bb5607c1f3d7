"""Stand-in for CVS's top-level package (see tests/cvs_standin/README.md)."""
