"""Detector settings: one frozen dataclass per detector is the one definition of its settings.

Each detector's pure function takes a frozen dataclass (``LeakParams``, ``StarvationParams``,
…). Its fields are the detector's settings: the default is written there once, and bounds are
written beside the type as ``annotated_types`` metadata (``Annotated[float, Gt(0)]``), which
holds no validation code. The rule-file model at the edge is generated from the dataclass
(:mod:`defrag.detectors.rulemodel`) and a loaded rule's settings are this dataclass, built from
the rule by one generic converter; so a setting is never written twice.

What this module adds, for the generator to read:

* :data:`Seconds` — a duration in seconds; in a rule file also ``30s``, ``15m``, ``6h``;
* :data:`Regex` — a regular expression (it must compile);
* :class:`RuleName` — a field's name in a rule file when it differs from the Python name
  (``lookback`` for ``lookback_s``);
* :data:`INTERNAL` — a field that is not a rule-file setting at all (the rule's name, a query
  the edge fills in, a tuning constant).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Final, Literal

Action = Literal["alert", "repack", "make-room"]
"""What the daemon does with a finding: alert only, repack in a window, make room."""
StarvationAction = Literal["alert", "repack", "make-room", "make-room-now"]
"""``make-room-now``: make room for the starved pods even when no execution window is open."""


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


DURATION: Final = _Marker("DURATION")
"""Metadata: the field is a duration in seconds (a rule file may write ``6h``)."""
Seconds = Annotated[float, DURATION]

REGEX: Final = _Marker("REGEX")
"""Metadata: the string is a regular expression (a rule file's must compile)."""
Regex = Annotated[str, REGEX]

INTERNAL: Final = _Marker("INTERNAL")
"""Metadata: not read from a rule file (the rule's name, a query the edge fills in, a tuning
constant); the dataclass default stands unless the edge passes a value."""


@dataclass(frozen=True, slots=True)
class RuleName:
    """Metadata: the field's name in a rule file when it is not the Python name (``lookback``
    for ``lookback_s``; ``for``, a Python keyword, for ``for_s``)."""

    name: str


__all__ = [
    "DURATION",
    "INTERNAL",
    "REGEX",
    "Action",
    "Regex",
    "RuleName",
    "Seconds",
    "StarvationAction",
]
