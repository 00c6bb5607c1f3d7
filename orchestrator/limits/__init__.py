"""Resource limits: CPU, memory and pids caps, GPU selection and vendor flags (pure)."""
