"""Kubernetes quantities and the units the model keeps (milli-CPU, MiB, milli-GPU)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

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
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity (``500m``, ``64Gi``, ``1e3``) to a Decimal in base units."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise QuantityError(f"not a Kubernetes quantity: {value!r}")
    try:
        number = Decimal(match["num"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise QuantityError(f"not a Kubernetes quantity: {value!r}") from exc
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * (Decimal(10) ** int(suffix[1:]))


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
