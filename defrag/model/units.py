"""Kubernetes quantities and the units the model keeps (milli-CPU, MiB, milli-GPU)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

GPU_MILLI = 1000
"""One whole GPU, in milli-GPU (the unit of GPU share)."""

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<int>\d*)(?:\.(?P<frac>\d*))?"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?"
)
"""The grammar k8s.io/apimachinery's ``parseQuantityString`` and ``suffixer.interpret`` accept
(pkg/api/resource/quantity.go, suffix.go): an optional sign, digits with an optional ``.`` and
fraction (``1.``, ``.5``), then a binary suffix, a decimal suffix or an exponent (``e3``,
``E-3``, ``E+6``; ``E`` alone is exa). No whitespace. The digits may be absent, as the Go parser
allows: ``+``, ``.``, ``Ki`` and ``e3`` all read as zero there and here."""

MAX_EXPONENT = 30
"""A quantity above 10^30 (or an exponent beyond ±2^63, which Go's ``strconv.ParseInt`` refuses)
is read as 10^30: no resource comes near it, and the model caps its sums far below."""


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity (``500m``, ``64Gi``, ``1e3``) to a Decimal in base units.

    Accepts exactly what ``resource.ParseQuantity`` accepts; magnitudes are capped at
    10^:data:`MAX_EXPONENT`. Numbers (from YAML/JSON) must be finite."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise QuantityError(f"not a finite quantity: {value!r}")
        return _capped(Decimal(str(value)))
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {value!r}")
    match = _QUANTITY.fullmatch(value)
    if not value or match is None:
        raise QuantityError(f"not a Kubernetes quantity: {value!r}")
    digits = (match["int"] or "0") + "." + (match["frac"] or "0")
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        number = Decimal(digits) * _BINARY[suffix]
    elif suffix not in _DECIMAL:  # an exponent: e3, E-3, E+6
        exponent = int(suffix[1:]) if len(suffix) < 24 else 2**64
        if abs(exponent) >= 2**63:
            raise QuantityError(f"not a Kubernetes quantity (exponent out of range): {value!r}")
        number = Decimal(f"{digits}E{max(min(exponent, 10 * MAX_EXPONENT), -10 * MAX_EXPONENT)}")
    else:
        number = Decimal(digits) * _DECIMAL[suffix]
    return _capped(-number if match["sign"] == "-" else number)


def _capped(number: Decimal) -> Decimal:
    limit = Decimal(10) ** MAX_EXPONENT
    return max(min(number, limit), -limit)


def cpu_milli(value: str | int | float) -> int:
    """CPU quantity → milli-CPU, rounded up as Kubernetes does."""
    return int((parse_quantity(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: str | int | float) -> int:
    """Memory quantity (bytes) → MiB, rounded up."""
    return int((parse_quantity(value) / 2**20).to_integral_value(rounding="ROUND_CEILING"))


def count(value: str | int | float) -> int:
    """An extended-resource count such as ``nvidia.com/gpu``; must be a whole number."""
    number = parse_quantity(value)
    if number != number.to_integral_value() or number < 0:
        raise QuantityError(f"not a whole, non-negative count: {value!r}")
    return int(number)


# --- durations ------------------------------------------------------------------------------

_DURATION_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
DURATION_FORM = "a duration such as 90s, 15m, 2h, 1h30m or 1w"
"""The one duration grammar of flags, settings and rule files: Prometheus's (``ms s m h d w
y``, components largest first, e.g. ``1h30m``)."""


def duration_seconds(text: str) -> float:
    """Seconds in a duration written as Prometheus writes them (``90s``, ``15m``, ``1h30m``,
    ``1w``); ValueError naming the expected form otherwise. Bare numbers are the caller's
    business (each caller knows its unit)."""
    value = text.strip()
    parts = _DURATION.findall(value)
    if not value or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"cannot read {text!r}: expected {DURATION_FORM}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
