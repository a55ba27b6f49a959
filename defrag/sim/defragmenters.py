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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from defrag.scoring.framework import Policy
from defrag.sim.defrag_hook import make_defrag_hook
from defrag.sim.hooks import DefragHook
from defrag.sim.peers import PEER_CONFIGS, KaiBinpack, make_peer

EXTENDER_POLICY = "reserve-binpack"
"""The score the scheduler extender installs (docs/kubernetes.md: its default policy)."""

Build = Callable[[str, str, dict[str, Any]], tuple[DefragHook | None, Policy | str]]
"""(run's policy, protocol, hook options) → (hook, the score the scheduler runs with)."""


@dataclass(frozen=True, slots=True)
class Defragmenter:
    """One row of the table: how to build it, and whether the fill protocol can run it."""

    build: Build
    fill: bool = False


def _daemon(score: str | None = None, **forced: Any) -> Build:
    """The daemon's hook (defrag.sim.defrag_hook) with ``forced`` options, under the scheduler
    score ``score`` (None: the run's policy)."""

    def build(policy: str, protocol: str, opts: dict[str, Any]) -> tuple[DefragHook, str]:
        sched = policy if score is None else score
        return make_defrag_hook(sched, protocol, **{**opts, **forced}), sched

    return build


def _proposed(policy: str, protocol: str, opts: dict[str, Any]) -> tuple[DefragHook, str]:
    return make_defrag_hook(policy, protocol, **{"make_room_now": True, **opts}), policy


_TABLE: dict[str, Defragmenter] = {
    "none": Defragmenter(lambda policy, protocol, opts: (None, policy), fill=True),
    "defrag": Defragmenter(_daemon(), fill=True),
    "defrag-extender": Defragmenter(_daemon(EXTENDER_POLICY)),
    # compared with defrag-extender: same scheduler, checkpoint-blind cost
    "defrag-blind": Defragmenter(_daemon(EXTENDER_POLICY, checkpoint_aware=False)),
    "defrag-proposed": Defragmenter(_proposed),
}


def _peer(name: str, scheduler: str) -> Build:
    """A peer (:data:`defrag.sim.peers.PEER_CONFIGS`) under the score its configuration names:
    ``policy`` (the run's), ``kai-binpack`` (KAI's own) or a policy name."""

    def build(policy: str, protocol: str, opts: dict[str, Any]) -> tuple[DefragHook, Policy | str]:
        if scheduler == "kai-binpack":
            return make_peer(name), KaiBinpack()
        return make_peer(name), policy if scheduler == "policy" else scheduler

    return build


_TABLE.update({name: Defragmenter(_peer(name, c.scheduler)) for name, c in PEER_CONFIGS.items()})

DEFRAGMENTERS: tuple[str, ...] = tuple(_TABLE)


class UnknownDefragmenter(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown defragmenter {name!r}; known: {', '.join(DEFRAGMENTERS)}")


def check_defragmenter(name: str, protocol: str) -> Defragmenter:
    """The table's row for ``name``; an error naming it when unknown or not for ``protocol``."""
    row = _TABLE.get(name)
    if row is None:
        raise UnknownDefragmenter(name)
    if protocol != "timeline" and not row.fill:
        raise ValueError(f"defragmenter {name!r} runs in the timeline protocol only")
    return row


def make_defragmenter(
    name: str, policy: str, protocol: str, hook_options: Mapping[str, Any] | None = None
) -> tuple[DefragHook | None, Policy | str]:
    """(hook, scheduler) for defragmenter ``name`` on a cluster whose scheduler is ``policy``."""
    return check_defragmenter(name, protocol).build(policy, protocol, dict(hook_options or {}))


__all__ = [
    "DEFRAGMENTERS",
    "EXTENDER_POLICY",
    "Defragmenter",
    "UnknownDefragmenter",
    "check_defragmenter",
    "make_defragmenter",
]
