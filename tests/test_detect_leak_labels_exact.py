"""DcgmLabels' per-series lookups, made cheaper, answer as their plain definitions do: the first
non-empty label of a list of names, and a pod name matched against the exporter pattern."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from defrag.detectors.leak.core import DcgmLabels

NAMES = ["UUID", "uuid", "pod", "exported_pod", "pod_name", "Hostname", "x"]
labels = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(["", "a", "0", "GPU-1"]))


def first_plain(labels: Mapping[str, str], names: Sequence[str]) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


@settings(max_examples=300, deadline=None)
@given(labels, st.lists(st.sampled_from(NAMES), max_size=4))
def test_first_is_the_first_non_empty_label(labels: dict[str, str], names: list[str]) -> None:
    assert DcgmLabels().first(labels, names) == first_plain(labels, names)


pods = st.sampled_from(
    ["dcgm-exporter", "nvidia-dcgm-exporter-x1", "dcgm-exporterz", "train-0", "", "dcgm-export"]
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["gpu-operator", "ml", ""]),
    pods,
    st.sampled_from([r"^(nvidia-)?dcgm-exporter(-.*)?$", r"train", ""]),
    st.booleans(),
)
def test_is_exporter_matches_as_re_match_does(
    namespace: str, pod: str, pattern: str, targeted: bool
) -> None:
    names = DcgmLabels(exporter_pod=pattern)
    key = f"{namespace}/{pod}"
    targets = frozenset({key}) if targeted else frozenset()
    plain = key in targets or bool(pattern and re.match(pattern, pod))
    assert names.is_exporter(key, targets) is plain
