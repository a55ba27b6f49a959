"""The defragmenters users run instead of defrag, each in its own documented configuration.

The ports live in :mod:`defrag.sim.descheduler` (kubernetes-sigs/descheduler's
HighNodeUtilization and LowNodeUtilization, with the DefaultEvictor) and :mod:`defrag.sim.kai`
(NVIDIA/KAI-Scheduler's consolidation action and binpack score); their conformance suites are
under ``tests/conformance/``. This module names the configurations a timeline run can pick
(docs/benchmarks.md, "Whose configuration"):

=============================  ==============================================================
name                           configuration
=============================  ==============================================================
``descheduler-hnu``            HighNodeUtilization as the descheduler README's example
                               (``README.md`` 498-522): thresholds 20%, evictionModes
                               ``OnlyThresholdingResources``, on ``nvidia.com/gpu`` (the
                               README: extended resources such as ``nvidia.com/gpu`` are
                               supported, 526); scheduler ``MostAllocated`` (452)
``descheduler-hnu-readme``     the README's example verbatim: cpu, memory, pods 20%
``descheduler-hnu-gpu50``      sensitivity: ``nvidia.com/gpu`` 50% (the earlier bench row)
``descheduler-hnu-lenient``    sensitivity: GPU 20% without ``OnlyThresholdingResources``
``descheduler-lnu``            LowNodeUtilization, ``nvidia.com/gpu`` 20% / 50% (the README's
                               example values for cpu, on the GPU); the cluster's scheduler
``kai-consolidation``          KAI's defaults: ``maxNumberConsolidationPreemptees`` 16, no
                               queue depth for consolidation, GPU and CPU binpack
=============================  ==============================================================

Every descheduler configuration runs with the DefaultEvictor's defaults (no ``nodeFit``) and
reads the trace's owner-less pods as controller-owned; KAI reads them through
:func:`~defrag.sim.kai.sim_priority`.
"""

from __future__ import annotations

from dataclasses import dataclass

from defrag.sim.descheduler import DefaultEvictor, HighNodeUtilization, LowNodeUtilization
from defrag.sim.hooks import DefragHook
from defrag.sim.kai import KaiBinpack, KaiConsolidation, sim_priority

SIM_EVICTOR = DefaultEvictor(bare_pods_owned=True)
ONLY = ("OnlyThresholdingResources",)


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """A peer's configuration for the timeline: what it is and the scheduler score it needs."""

    name: str
    scheduler: str
    """``most-allocated``, ``kai-binpack``, or ``policy`` (the run's own)."""
    summary: str


MOST = "most-allocated"
PEER_CONFIGS = {
    c.name: c
    for c in (
        PeerConfig("descheduler-hnu", MOST, "HNU, GPU 20%, OnlyThresholdingResources"),
        PeerConfig("descheduler-hnu-readme", MOST, "HNU, cpu/memory/pods 20% (README)"),
        PeerConfig("descheduler-hnu-gpu50", MOST, "HNU, GPU 50%, OnlyThresholdingResources"),
        PeerConfig("descheduler-hnu-lenient", MOST, "HNU, GPU 20%, every pod"),
        PeerConfig("descheduler-lnu", "policy", "LNU, GPU 20% / 50%"),
        PeerConfig("kai-consolidation", "kai-binpack", "KAI consolidation, 16 preemptees"),
    )
}
PEERS = tuple(PEER_CONFIGS)


def make_peer(name: str) -> DefragHook:
    """The hook of peer configuration ``name`` (one of :data:`PEERS`)."""
    if name == "descheduler-hnu":
        return HighNodeUtilization({"gpu": 20.0}, eviction_modes=ONLY, evictor=SIM_EVICTOR)
    if name == "descheduler-hnu-readme":
        return HighNodeUtilization(
            {"cpu": 20.0, "memory": 20.0, "pods": 20.0}, eviction_modes=ONLY, evictor=SIM_EVICTOR
        )
    if name == "descheduler-hnu-gpu50":
        return HighNodeUtilization({"gpu": 50.0}, eviction_modes=ONLY, evictor=SIM_EVICTOR)
    if name == "descheduler-hnu-lenient":
        return HighNodeUtilization({"gpu": 20.0}, evictor=SIM_EVICTOR)
    if name == "descheduler-lnu":
        return LowNodeUtilization({"gpu": 20.0}, {"gpu": 50.0}, evictor=SIM_EVICTOR)
    if name == "kai-consolidation":
        return KaiConsolidation(priority_of=sim_priority)
    raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")


__all__ = ["PEERS", "PEER_CONFIGS", "KaiBinpack", "PeerConfig", "make_peer"]
