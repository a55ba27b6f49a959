"""The policy registry: one name → one score function, shared by simulator, planner, extender."""

from __future__ import annotations

from collections.abc import Callable

from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Policy
from defrag.scoring.policies.allocation import LeastAllocated, MostAllocated
from defrag.scoring.policies.fgd import Fgd
from defrag.scoring.policies.fit import BestFit, DotProduct
from defrag.scoring.policies.random_policy import RandomPolicy
from defrag.scoring.policies.reserve_binpack import ReserveBinpack
from defrag.scoring.policies.tiers import GpuClustering, GpuPacking

DEFAULT_POLICY = "reserve-binpack"

_FACTORIES: dict[str, Callable[[WorkloadMix | None, int], Policy]] = {
    "reserve-binpack": lambda mix, seed: ReserveBinpack(),
    "least-allocated": lambda mix, seed: LeastAllocated(),
    "most-allocated": lambda mix, seed: MostAllocated(),
    "best-fit": lambda mix, seed: BestFit(),
    "dot-product": lambda mix, seed: DotProduct(),
    "gpu-packing": lambda mix, seed: GpuPacking(),
    "gpu-clustering": lambda mix, seed: GpuClustering(),
    "fgd": lambda mix, seed: Fgd(mix),
    "random": lambda mix, seed: RandomPolicy(seed),
}

POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)


class UnknownPolicy(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")


def make_policy(name: str, *, mix: WorkloadMix | None = None, seed: int = 0) -> Policy:
    """A fresh policy by name. ``mix`` feeds fgd; ``seed`` feeds random."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownPolicy(name) from None
    return factory(mix, seed)


__all__ = ["DEFAULT_POLICY", "POLICY_NAMES", "Policy", "UnknownPolicy", "make_policy"]
