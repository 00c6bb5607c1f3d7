"""Containers: probe, pure plan, lifecycle, provisioning, docker argv, exec, MPI hostfile."""
