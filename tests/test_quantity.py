"""Quantities: exactly what Kubernetes accepts, nothing it refuses.

Source: k8s.io/apimachinery pkg/api/resource/quantity_test.go (TestQuantityParse: its table of
parsed quantities and its ``invalid`` list), read at kubernetes/apimachinery
eed236ceee2c19c2753a3d93ac0631dc20750454, and parseQuantityString / suffixer.interpret in
quantity.go and suffix.go for the edge cases marked "parser". Expected values are the exact
decimal value (Go rounds a fraction below a nano up to 1n; the model rounds up itself).
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from defrag.adapters.kube_convert import ConversionError, node_from_json
from defrag.model.units import QuantityError, cpu_milli, memory_mib, parse_quantity

KI, MI, GI, TI = 2**10, 2**20, 2**30, 2**40

ACCEPTED = [
    # TestQuantityParse, the upstream table
    ("0", Decimal(0)),
    ("0n", Decimal(0)),
    ("0Ki", Decimal(0)),
    ("1Ki", Decimal(KI)),
    ("7Mi", Decimal(7 * MI)),
    ("6Gi", Decimal(6 * GI)),
    ("5Ti", Decimal(5 * TI)),
    ("3Ei", Decimal(3 * 2**60)),
    ("5n", Decimal("5e-9")),
    ("4u", Decimal("4e-6")),
    ("3m", Decimal("0.003")),
    ("8k", Decimal(8000)),
    ("7M", Decimal(7 * 10**6)),
    ("300T", Decimal(300 * 10**12)),
    ("2P", Decimal(2 * 10**15)),
    ("1E", Decimal(10**18)),  # exa: crashed `report` before
    ("12E", Decimal(12 * 10**18)),
    ("1E-3", Decimal("0.001")),
    ("1e3", Decimal(1000)),
    ("1E18", Decimal(10**18)),
    ("100.035k", Decimal("100035")),
    (".001", Decimal("0.001")),
    ("0.5e-2", Decimal("0.005")),
    ("1.3E+6", Decimal(1_300_000)),
    ("1.01E", Decimal("1.01e18")),
    ("3.001n", Decimal("3.001e-9")),
    ("100.035Ki", Decimal("100.035") * KI),
    ("0.5Mi", Decimal(MI // 2)),
    ("1.", Decimal(1)),
    ("1.G", Decimal(10**9)),
    # the brief's examples
    ("500m", Decimal("0.5")),
    ("+1", Decimal(1)),
    (".5", Decimal("0.5")),
    ("1.5Gi", Decimal(3 * GI // 2)),
    ("-3", Decimal(-3)),  # parsed; a negative request is refused by the converter
    ("2", Decimal(2)),
    ("64Gi", Decimal(64 * GI)),
    ("1.5k", Decimal(1500)),
    ("100Mi", Decimal(100 * MI)),
    # parser: the digits may be missing, and then the number is zero
    ("+", Decimal(0)),
    (".", Decimal(0)),
    ("Ki", Decimal(0)),
    ("e3", Decimal(0)),
    # numbers from JSON/YAML
    (3, Decimal(3)),
    (0.25, Decimal("0.25")),
]

REFUSED = [
    # TestQuantityParse's invalid list
    "1.1.M",
    "1+1.0M",
    "0.1mi",
    "0.1am",
    "aoeu",
    ".5i",
    "1i",
    "-3.01i",
    "-3.01e-",
    " 1",  # trailing and leading whitespace is forbidden upstream
    "1 ",
    # ParseQuantity: empty; suffixer.interpret: unknown suffixes, an exponent without digits
    # or beyond int64 (strconv.ParseInt fails)
    "",
    "1e",
    "1K",
    "1ki",
    "1Kie3",
    "1e99999999999999999999",
    "--1",
    "5 Gi",
    "abc",
    "1.2.3",
    "NaN",
    "Infinity",
]


@pytest.mark.parametrize(("text", "expected"), ACCEPTED, ids=[str(a[0]) for a in ACCEPTED])
def test_every_quantity_kubernetes_accepts_is_parsed(
    text: str | int | float, expected: Decimal
) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", REFUSED)
def test_every_quantity_kubernetes_refuses_is_refused(text: str) -> None:
    with pytest.raises(QuantityError, match="quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, True, None, [1], {"a": 1}])
def test_non_finite_and_non_numbers_are_refused(value: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(value)  # type: ignore[arg-type]


def test_huge_quantities_are_capped_not_slow() -> None:
    """10^30 is the cap: ``1e9223372036854775807`` (the largest exponent Go reads) is 10^30,
    and converts to milli-CPU and MiB as ordinary integers."""
    assert parse_quantity("1e9223372036854775807") == Decimal(10) ** 30
    assert parse_quantity(1e308) == Decimal(10) ** 30
    assert cpu_milli("1E") == 10**21  # 10^18 CPUs × 1000
    assert memory_mib("1Ei") == 2**40


def _node(cpu: object) -> dict[str, object]:
    return {
        "kind": "Node",
        "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": cpu, "memory": "1Gi"}},
    }


@pytest.mark.parametrize("bad", ["1 ", "0.1mi", "1e", math.inf, math.nan, True, [1]])
def test_a_refused_quantity_names_its_field(bad: object) -> None:
    with pytest.raises(ConversionError, match=r"status\.allocatable\.cpu"):
        node_from_json(_node(bad))


def test_an_exa_cpu_node_converts() -> None:
    """``cpu: "1E"`` is a valid quantity: the node converts (capped to what int64 sums hold)."""
    node = node_from_json(_node("1E"))
    assert node.name == "n1"
    assert node.cpu_milli > 10**12
