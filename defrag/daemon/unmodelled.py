"""Objects the snapshot could not model, told to their owners as Kubernetes Events.

A pod or node defrag cannot read fully (``Cluster.warnings``: ``Pod ns/name: field: …`` or
``Node name: field: …``) is left out of the model or counted conservatively. The leader posts
one Warning Event ``DefragNotModelled`` on each such object, once while the warning lasts (said
again if it comes back after being fixed), so its owner sees why defrag leaves it alone. Dry
run posts them only when its :class:`~defrag.execute.mode.RunMode` writes Events.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from defrag.execute.fence import Fence, NoFence
from defrag.execute.mode import RunMode
from defrag.ports import Actuator

log = logging.getLogger(__name__)

REASON = "DefragNotModelled"


class UnmodelledReporter:
    """Posts ``DefragNotModelled`` once per warning while it lasts; remembers what it said."""

    def __init__(self, actuator: Actuator, mode: RunMode) -> None:
        self.actuator = actuator
        self.mode = mode
        self.fence: Fence = NoFence()
        """Asked before each Event; the daemon sets its LeaseElector here."""
        self._told: set[str] = set()

    def report(self, warnings: Sequence[str]) -> int:
        """Post an Event for each warning not yet told; returns the Events sent."""
        current = set(warnings)
        self._told &= current  # said again if it comes back after being fixed
        if not self.mode.writes_events:
            return 0
        sent = 0
        for warning in sorted(current - self._told):
            target = warning_target(warning)
            if target is None or not self.fence.still_leader():
                continue
            kind, namespace, name = target
            try:
                self.actuator.event(kind, namespace, name, REASON, warning, True)
            except Exception as exc:  # told again next cycle
                log.warning("event %s on %s %s/%s not sent: %s", REASON, kind, namespace, name, exc)
                continue
            self._told.add(warning)
            sent += 1
        return sent


def warning_target(warning: str) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of the object a conversion warning names, if it names one."""
    head = warning.split(":", 1)[0]
    kind, _, ident = head.partition(" ")
    if kind == "Pod" and "/" in ident:
        namespace, _, name = ident.partition("/")
        return kind, namespace, name
    if kind == "Node" and ident and "/" not in ident:
        return kind, "", ident
    return None


__all__ = ["REASON", "UnmodelledReporter", "warning_target"]
