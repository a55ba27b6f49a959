"""The outcome of a check: ``ok``, or the reasons it is not — the vocabulary every floor speaks.

Scheduling filters, the planner's constraints, the executor's budgets, the health endpoints and
the extender all answer with a :class:`Status` rather than a bare bool, so a refusal always
says why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Status:
    """The outcome of a check: ``ok`` and, when not ok, the reasons."""

    ok: bool
    reasons: tuple[str, ...] = ()

    @classmethod
    def success(cls) -> Status:
        return cls(True)

    @classmethod
    def fail(cls, *reasons: str) -> Status:
        return cls(False, tuple(reasons))

    def __str__(self) -> str:
        return "ok" if self.ok else "; ".join(self.reasons)


__all__ = ["Status"]
