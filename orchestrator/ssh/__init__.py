"""SSH to the hosts: one reused connection per host, fan-out, per-cluster keys."""
