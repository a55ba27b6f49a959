"""The one count of evictions against an :class:`~defrag.plan.config.EvictionBudget`.

:class:`BudgetLedger` is what a window opening has spent: in all, per node, per namespace. The
planner starts each plan from the window's spend (a plan stays within what is left of it), the
executor admits every eviction through it again as they go out (and records it on the Lease),
and the simulator's actuator admits the simulated evictions through it. Pure: no client, no
clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from defrag.model.status import Status
from defrag.plan.config import EvictionBudget

WINDOW_BUDGET = "budget-window"
NODE_BUDGET = "budget-node"
NAMESPACE_BUDGET = "budget-namespace"

Charge = tuple[str, str]
"""One eviction as a budget sees it: (namespace, node)."""


@dataclass(slots=True)
class BudgetLedger:
    """What one window opening has spent against ``budgets``. A new window key starts a fresh
    ledger."""

    budgets: EvictionBudget
    window: str = ""
    total: int = 0
    by_node: Counter[str] = field(default_factory=Counter)
    by_namespace: Counter[str] = field(default_factory=Counter)

    def for_window(self, key: str) -> BudgetLedger:
        """This ledger if it counts ``key``'s window, else a fresh one for it."""
        if key == self.window:
            return self
        return BudgetLedger(self.budgets, key)

    def copy(self) -> BudgetLedger:
        return self.within(self.budgets)

    def within(self, budgets: EvictionBudget) -> BudgetLedger:
        """This spend counted against other limits (a plan's, sized by its backlog)."""
        return BudgetLedger(
            budgets, self.window, self.total, Counter(self.by_node), Counter(self.by_namespace)
        )

    @property
    def left(self) -> int | None:
        """Evictions left in all (None: unlimited)."""
        limit = self.budgets.total
        return None if limit is None else max(limit - self.total, 0)

    def to_dict(self) -> dict[str, object]:
        """The spend, without the limits (those come from the settings of whoever reads it)."""
        return {
            "window": self.window,
            "total": self.total,
            "by_node": {k: n for k, n in sorted(self.by_node.items()) if n > 0},
            "by_namespace": {k: n for k, n in sorted(self.by_namespace.items()) if n > 0},
        }

    @classmethod
    def from_dict(cls, budgets: EvictionBudget, data: Mapping[str, object]) -> BudgetLedger:
        """The ledger :meth:`to_dict` wrote, counted against ``budgets``; ValueError when
        ``data`` is not such a spend."""
        window = spend_window(data)
        return cls(
            budgets,
            window,
            _count(data, "total"),
            Counter(_counts(data, "by_node")),
            Counter(_counts(data, "by_namespace")),
        )

    def merged(self, other: BudgetLedger) -> BudgetLedger:
        """The larger spend of the two, key by key (same window): what either saw spent."""
        return BudgetLedger(
            self.budgets,
            self.window,
            max(self.total, other.total),
            self.by_node | other.by_node,  # Counter | Counter: the larger count of each key
            self.by_namespace | other.by_namespace,
        )

    def check(self, charges: Sequence[Charge]) -> tuple[Status, int | None]:
        """Whether spending ``charges`` (in order) stays within the budgets, and the index of
        the first charge that would break one (None when none does). Spends nothing."""
        b = self.budgets
        nodes: Counter[str] = Counter()
        spaces: Counter[str] = Counter()
        for i, (namespace, node) in enumerate(charges):
            if b.total is not None and self.total + i + 1 > b.total:
                return _refused(WINDOW_BUDGET, "in this window", self.total, b.total, i + 1), i
            nodes[node] += 1
            if b.per_node is not None and self.by_node[node] + nodes[node] > b.per_node:
                spent = self.by_node[node]
                where = f"from node {node}"
                return _refused(NODE_BUDGET, where, spent, b.per_node, nodes[node]), i
            spaces[namespace] += 1
            if (
                b.per_namespace is not None
                and self.by_namespace[namespace] + spaces[namespace] > b.per_namespace
            ):
                spent, asked = self.by_namespace[namespace], spaces[namespace]
                where = f"in namespace {namespace}"
                return _refused(NAMESPACE_BUDGET, where, spent, b.per_namespace, asked), i
        return Status.success(), None

    def commit(self, charges: Sequence[Charge]) -> None:
        """Count ``charges`` as spent (after :meth:`check` said they fit)."""
        self.total += len(charges)
        self.by_node.update(node for _, node in charges)
        self.by_namespace.update(namespace for namespace, _ in charges)

    def admit(self, charges: Sequence[Charge]) -> Status:
        """Spend budget for ``charges`` — a gang at once — or refuse all."""
        status, _ = self.check(charges)
        if status.ok:
            self.commit(charges)
        return status

    def refund(self, charges: Sequence[Charge]) -> None:
        """Give back what :meth:`admit` spent on ``charges`` (never below nothing): steps that
        turned out not to need an eviction (a pod already Terminating)."""
        for namespace, node in charges:
            self.total = max(self.total - 1, 0)
            self.by_node[node] = max(self.by_node[node] - 1, 0)
            self.by_namespace[namespace] = max(self.by_namespace[namespace] - 1, 0)

    def snapshot(self) -> tuple[int, Counter[str], Counter[str]]:
        return self.total, self.by_node.copy(), self.by_namespace.copy()

    def restore(self, state: tuple[int, Counter[str], Counter[str]]) -> None:
        self.total, self.by_node, self.by_namespace = state[0], state[1].copy(), state[2].copy()


def _refused(constraint: str, where: str, spent: int, limit: int, asked: int) -> Status:
    """The refusal of a budget: what is spent of it, and how many more the charges asked of it
    up to the one that breaks it."""
    return Status.fail(
        f"{constraint}: {spent} of {limit} evictions {where} spent, {asked} more asked"
    )


def spend_window(data: Mapping[str, object]) -> str:
    """The window key of a recorded spend, after checking the whole spend has the shape
    :meth:`BudgetLedger.to_dict` writes; ValueError naming what is wrong."""
    window = data.get("window")
    if not isinstance(window, str):
        raise ValueError("no window key")
    _count(data, "total")
    _counts(data, "by_node")
    _counts(data, "by_namespace")
    return window


def _count(data: Mapping[str, object], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is not a count: {value!r}")
    return value


def _counts(data: Mapping[str, object], key: str) -> dict[str, int]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} is not a mapping: {value!r}")
    for name, n in value.items():
        if not isinstance(name, str) or not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{key} has {name!r}: {n!r}, not a name and a count")
    return dict(value)


__all__ = ["NAMESPACE_BUDGET", "NODE_BUDGET", "WINDOW_BUDGET", "BudgetLedger", "spend_window"]
