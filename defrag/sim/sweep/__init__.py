"""What-if sweeps: a settings grid over traces, seeds and rows (defragmenters and peers), each run
a pure task keyed by its inputs, run on Dask, cached on disk, reduced to tables and plots
(docs/simulator.md, "Sweeps")."""
