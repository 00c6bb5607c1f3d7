"""Stand-in for cvs.lib.globals: the shared logger."""

import logging

log = logging.getLogger("cvs")
error_list = []
