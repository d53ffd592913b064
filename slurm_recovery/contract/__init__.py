"""The formats that cross a process boundary, in one dependency-free layer.

Slurm's hooks, the sidecar, the controller and the CLI run as separate processes, often on
different hosts and at different versions during an upgrade. What one writes and another reads
lives here and nowhere else: the evidence wire format and its event kinds (:mod:`.wire`), the
hook spool (:mod:`.spool`), durations (:mod:`.durations`), Slurm host lists (:mod:`.hostlist`),
sbatch output-file patterns (:mod:`.outputs`) and the settings the hooks read
(:mod:`.settings`).

The layer imports the standard library only (ClusterShell is loaded lazily for the rare host
lists the fast parser leaves to it), never another slurm_recovery package: Slurm waits for
every hook, and a hook imports nothing else (docs/architecture.md; import-linter holds both
rules in CI).
"""
