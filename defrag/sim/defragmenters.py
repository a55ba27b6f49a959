"""The defragmenters a timeline run can have in its loop, by name, and the scheduler each runs
with (docs/simulator.md, "Defragmenters side by side").

=====================  ==============================================  =====================
name                   hook                                            scheduler
=====================  ==============================================  =====================
``none``               —                                               the run's policy
``defrag``             the daemon (:mod:`defrag.sim.defrag_hook`)      the run's policy
``defrag-extender``    the daemon                                      ``reserve-binpack``
                                                                       (the extender's score)
``defrag-blind``       the daemon, checkpoint-blind cost               ``reserve-binpack``
``defrag-proposed``    the daemon with the starvation rule's action     the run's policy
                       ``make-room-now`` (rooms at any cycle, not
                       only in windows; docs/simulator.md)
``descheduler-hnu…``  :class:`~defrag.sim.descheduler.HighNodeUtilization`  ``most-allocated``
``descheduler-lnu``    :class:`~defrag.sim.descheduler.LowNodeUtilization`   the run's policy
``kai-consolidation``  :class:`~defrag.sim.kai.KaiConsolidation`             KAI binpack
=====================  ==============================================  =====================

The peers' configurations (``descheduler-hnu`` and its sensitivity rows) are
:data:`defrag.sim.peers.PEER_CONFIGS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from defrag.scoring.framework import Policy
from defrag.sim.defrag_hook import make_defrag_hook
from defrag.sim.hooks import DefragHook
from defrag.sim.peers import PEER_CONFIGS, PEERS, KaiBinpack, make_peer

DEFRAGMENTERS = (
    "none",
    "defrag",
    "defrag-extender",
    "defrag-blind",
    "defrag-proposed",
    *PEERS,
)
EXTENDER_POLICY = "reserve-binpack"
"""The score the scheduler extender installs (docs/kubernetes.md: its default policy)."""


def make_defragmenter(
    name: str, policy: str, protocol: str, hook_options: Mapping[str, Any] | None = None
) -> tuple[DefragHook | None, Policy | str]:
    """(hook, scheduler) for defragmenter ``name`` on a cluster whose scheduler is ``policy``."""
    opts = dict(hook_options or {})
    if name not in DEFRAGMENTERS:
        raise ValueError(f"unknown defragmenter {name!r}; known: {', '.join(DEFRAGMENTERS)}")
    if protocol != "timeline" and name not in ("none", "defrag"):
        raise ValueError(f"defragmenter {name!r} runs in the timeline protocol only")
    if name == "none":
        return None, policy
    if name == "defrag":
        return make_defrag_hook(policy, protocol, **opts), policy
    if name == "defrag-extender":
        return make_defrag_hook(EXTENDER_POLICY, protocol, **opts), EXTENDER_POLICY
    if name == "defrag-blind":  # compared with defrag-extender: same scheduler, blind cost
        opts["checkpoint_aware"] = False
        return make_defrag_hook(EXTENDER_POLICY, protocol, **opts), EXTENDER_POLICY
    if name == "defrag-proposed":
        opts.setdefault("make_room_now", True)
        return make_defrag_hook(policy, protocol, **opts), policy
    peer = make_peer(name)
    sched = PEER_CONFIGS[name].scheduler
    if sched == "kai-binpack":
        return peer, KaiBinpack()
    return peer, policy if sched == "policy" else sched


__all__ = ["DEFRAGMENTERS", "EXTENDER_POLICY", "make_defragmenter"]
