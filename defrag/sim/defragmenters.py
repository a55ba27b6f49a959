"""The defragmenters a timeline run can have in its loop, by name, and the scheduler each runs
with (docs/simulator.md, "Defragmenters side by side").

=====================  ==============================================  =====================
name                   hook                                            scheduler
=====================  ==============================================  =====================
``none``               —                                               the run's policy
``defrag``             the daemon (:mod:`defrag.sim.daemon_driver`;    the run's policy
                       the fill protocol: :mod:`defrag.sim.fill_hook`)
``defrag-extender``    the daemon                                      ``reserve-binpack``
                                                                       (the extender's score)
``defrag-blind``       the daemon, no pod shows its checkpoint         ``reserve-binpack``
``defrag-proposed``    the daemon with the starvation rules' action     the run's policy
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from defrag.decide import URGENT
from defrag.rules import RuleSet
from defrag.scoring.framework import Policy
from defrag.sim.daemon_driver import DaemonDriver, daemon_setup
from defrag.sim.daemon_view import ClusterView
from defrag.sim.fill_hook import FillHook
from defrag.sim.hooks import DefragHook
from defrag.sim.peers import PEER_CONFIGS, KaiBinpack, make_peer

EXTENDER_POLICY = "reserve-binpack"
"""The score the scheduler extender installs (docs/kubernetes.md: its default policy)."""


@dataclass(frozen=True, slots=True)
class DaemonOptions:
    """How the daemon in a run is configured: its settings file (None: the simulator's,
    :data:`~defrag.sim.daemon_driver.SIM_SETTINGS`), settings given as flags (dotted keys) and
    the timeline's window period (the default settings' windows)."""

    settings_file: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)
    window_every_h: float = 6.0


Build = Callable[[str, str, DaemonOptions], tuple[DefragHook | None, Policy | str]]
"""(run's policy, protocol, the daemon's options) → (hook, the score the scheduler runs
with)."""


@dataclass(frozen=True, slots=True)
class Defragmenter:
    """One row of the table: how to build it, and whether the fill protocol can run it."""

    build: Build
    fill: bool = False


def _daemon(score: str | None = None, *, checkpoints: bool = True, urgent: bool = False) -> Build:
    """The daemon (:class:`~defrag.sim.daemon_driver.DaemonDriver`) under the scheduler score
    ``score`` (None: the run's policy); ``checkpoints``: pods show their last checkpoint;
    ``urgent``: the starvation rules that make room do it at any cycle (``make-room-now``)."""

    def build(policy: str, protocol: str, opts: DaemonOptions) -> tuple[DefragHook, str]:
        sched = policy if score is None else score
        if protocol == "fill":
            return FillHook(), sched
        file = Path(opts.settings_file) if opts.settings_file else None
        setup = daemon_setup(file, opts.overrides, window_every_h=opts.window_every_h, policy=sched)
        if urgent:
            setup = replace(setup, rules=make_room_now(setup.rules))
        return DaemonDriver(setup, view=ClusterView(checkpoints=checkpoints)), sched

    return build


def make_room_now(rules: RuleSet) -> RuleSet:
    """``rules`` with every starvation rule that makes room doing it at any cycle."""
    changed = tuple(
        replace(r, rule=r.rule.model_copy(update={"action": URGENT}))
        if r.rule.detector == "starvation" and getattr(r.rule, "action", None) == "make-room"
        else r
        for r in rules
    )
    return RuleSet(changed)


_TABLE: dict[str, Defragmenter] = {
    "none": Defragmenter(lambda policy, protocol, opts: (None, policy), fill=True),
    "defrag": Defragmenter(_daemon(), fill=True),
    "defrag-extender": Defragmenter(_daemon(EXTENDER_POLICY)),
    # compared with defrag-extender: same scheduler, no pod shows its checkpoint
    "defrag-blind": Defragmenter(_daemon(EXTENDER_POLICY, checkpoints=False)),
    "defrag-proposed": Defragmenter(_daemon(urgent=True)),
}


def _peer(name: str, scheduler: str) -> Build:
    """A peer (:data:`defrag.sim.peers.PEER_CONFIGS`) under the score its configuration names:
    ``policy`` (the run's), ``kai-binpack`` (KAI's own) or a policy name."""

    def build(policy: str, protocol: str, opts: DaemonOptions) -> tuple[DefragHook, Policy | str]:
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
    name: str, policy: str, protocol: str, daemon: DaemonOptions | None = None
) -> tuple[DefragHook | None, Policy | str]:
    """(hook, scheduler) for defragmenter ``name`` on a cluster whose scheduler is ``policy``."""
    return check_defragmenter(name, protocol).build(policy, protocol, daemon or DaemonOptions())


__all__ = [
    "DEFRAGMENTERS",
    "EXTENDER_POLICY",
    "DaemonOptions",
    "Defragmenter",
    "UnknownDefragmenter",
    "check_defragmenter",
    "make_defragmenter",
]
