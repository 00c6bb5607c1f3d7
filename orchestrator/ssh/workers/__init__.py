"""Worker processes of the coordinator, one per core: `parent` (when to use
them, which hosts go where, each worker's frames seen from the coordinator),
`child` (the worker process itself), `runner` (the `HostRunner` they make),
`frames` (what travels between them). Nothing here imports `runner` but the
callers, so no module of the package imports one that imports it back."""
