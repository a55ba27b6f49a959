"""The scoring profile: the one value that says how defrag scores a cluster.

An operator configures a :class:`ProfileConfig` once (the ``policy`` and its arguments, in the
settings file the daemon, the extender and the CLI all read). For each snapshot of the cluster,
:meth:`ProfileConfig.for_cluster` builds one :class:`ScoringProfile`: the configuration plus the
workload mix that cluster holds (FGD scores against it, and the FGD fragmentation figure is
measured against it). Placement, the planner, the detectors, the extender and the simulator are
all handed that one profile — never a policy name — so they cannot disagree on a score.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from defrag.model.cluster import Cluster
from defrag.model.workload import WorkloadMix
from defrag.scoring.framework import Policy
from defrag.scoring.policies import DEFAULT_POLICY, POLICY_NAMES, UnknownPolicy, make_policy


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """What is configured: the policy by name and its arguments (``seed`` feeds ``random``)."""

    policy: str = DEFAULT_POLICY
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise UnknownPolicy(self.policy)

    def for_cluster(self, cluster: Cluster) -> ScoringProfile:
        """The profile for one snapshot (bound to its observed workload mix): built once,
        handed to every part that scores it."""
        return self.with_mix(WorkloadMix.observed(cluster.pods.values()))

    def with_mix(self, mix: WorkloadMix) -> ScoringProfile:
        """The profile for a known mix (the simulator's, drawn from its trace)."""
        return ScoringProfile(self, mix)


@dataclass(frozen=True)
class ScoringProfile:
    """A configuration bound to one snapshot's workload mix; :attr:`policy` is its score
    function, built once (a profile is immutable, so every holder scores alike)."""

    config: ProfileConfig
    mix: WorkloadMix
    policy: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        built = make_policy(self.config.policy, mix=self.mix, seed=self.config.seed)
        object.__setattr__(self, "policy", built)

    @property
    def name(self) -> str:
        """The policy's name (for reports and labels; never used to rebuild it)."""
        return self.config.policy

    def reference(self, name: str) -> Policy:
        """Another score function on the same mix and seed, to judge placements someone else
        made against it (the ``spreading`` detector asks which score the cluster's scheduler
        follows) — never to place or plan: those score with :attr:`policy`."""
        if name == self.config.policy:
            return self.policy
        if name not in POLICY_NAMES:
            raise UnknownPolicy(name)
        return make_policy(name, mix=self.mix, seed=self.config.seed)

    @classmethod
    def default(cls, cluster: Cluster | None = None) -> ScoringProfile:
        """The default configuration for ``cluster`` (its observed mix), or the default mix."""
        config = ProfileConfig()
        return (
            config.for_cluster(cluster)
            if cluster is not None
            else config.with_mix(WorkloadMix.default())
        )


__all__ = ["ProfileConfig", "ScoringProfile"]
