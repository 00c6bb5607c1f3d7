"""PURE: (container config, {host: HostState}) -> Plan, one idea per module:
model.py (Plan, HostAction, the ways out), ownership.py (whose container, one
`ownership` for up and down), lifetimes.py (`decide_plan`), images.py (image
agreement across hosts), facts.py (host facts: capacity, GPUs, ...), down.py
(`decide_down`). Import from the module that holds a name.

No IO here: every decision about attaching, cold-starting, restarting,
replacing or refusing is a function of probed facts, so it is tested table-
driven and with hypothesis (tests/test_plan.py). The lifetime rules are the
table in docs/design.md:

- no_launch: verify running everywhere; never start or remove anything.
- per_run: start fresh everywhere; replace a same-named container only if it
  carries our label (`--force` replaces a foreign one too).
- per_job (inside a Slurm job; the name carries the job ID): up as
  persistent, down as per_run; the job's end removes them (jobend.py).
- persistent: all running -> attach; none present -> cold start; present
  everywhere, stopped (exited, created) or paused on some or all hosts ->
  restart those (`docker start` / `docker unpause`: keeps the overlay, so a
  node reboot heals by itself) and attach the rest; missing on some hosts, a
  state nothing safely resumes (restarting, dead, removing) -> refuse, naming
  the hosts in each state and both ways out. `--force` replaces instead of
  refusing; it is the only way a plan removes a persistent container.

Any host whose state is unknown (unreachable, docker daemon down, no docker
access, garbled probe) refuses the plan: unknown is never treated as absent.
"""
