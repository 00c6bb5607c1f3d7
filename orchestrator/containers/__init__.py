"""Containers: probe, pure plan and status, lifecycle, provisioning, docker argv, exec, MPI."""
