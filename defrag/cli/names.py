"""Names the command line shows in its help, written out here so that building the app (and
``defrag --help``) imports neither the scoring policies (numpy) nor the simulator (scipy).

``tests/test_cli_lazy_imports.py`` checks each against the registry it mirrors."""

from __future__ import annotations

POLICY_NAMES: tuple[str, ...] = (
    "reserve-binpack",
    "least-allocated",
    "most-allocated",
    "best-fit",
    "dot-product",
    "gpu-packing",
    "gpu-clustering",
    "fgd",
    "random",
)
"""= :data:`defrag.scoring.policies.POLICY_NAMES`."""

DEFAULT_POLICY = "reserve-binpack"
"""= :data:`defrag.scoring.policies.DEFAULT_POLICY`."""

DEFRAGMENTERS: tuple[str, ...] = (
    "none",
    "defrag",
    "defrag-extender",
    "defrag-blind",
    "defrag-proposed",
    "descheduler-hnu",
    "descheduler-lnu",
    "kai-consolidation",
)
"""= :data:`defrag.sim.defragmenters.DEFRAGMENTERS`."""

GOALS: tuple[str, ...] = ("repack", "make-room", "all")
"""= :data:`defrag.plan.model.GOALS`."""

GPU_MILLI = 1000
"""= :data:`defrag.model.units.GPU_MILLI`: a whole GPU in thousandths."""
