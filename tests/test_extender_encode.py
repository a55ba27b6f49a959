"""The vectorised prioritize answer is byte for byte the plain encoder's (which
tests/test_extender_wire.py pins to kube-scheduler's HostPriorityList)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from defrag.extender.wire import encode_priorities, encode_priorities_at, host_prefixes

VIEW = ("gpu-a", "gpu-b", "gpu-c.zone-1")

CASES = [
    # (requested hosts, their scores)
    ((), ()),
    (("gpu-a",), (10,)),
    (("gpu-c.zone-1", "gpu-a", "gpu-b"), (0, 9, 10)),
    (("gpu-b", "new-node", "gpu-a"), (3, 0, 7)),  # a host the view does not know
    (("gpu-a", 'Odd"Name'), (1, 0)),  # a host that needs escaping: the plain encoder answers
]


@pytest.mark.parametrize(("hosts", "scores"), CASES)
def test_vectorised_answer_is_the_plain_one(
    hosts: tuple[str, ...], scores: tuple[int, ...]
) -> None:
    prefixes = host_prefixes(VIEW)
    assert prefixes is not None
    index = {name: row for row, name in enumerate(VIEW)}
    rows = np.array([index.get(h, -1) for h in hosts], dtype=np.int64)
    fast = encode_priorities_at(prefixes, rows, hosts, np.array(scores, dtype=np.int64))
    assert fast == encode_priorities(hosts, scores)
    assert json.loads(fast) == [{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)]


def test_a_view_with_a_name_to_escape_has_no_prefixes() -> None:
    assert host_prefixes(("gpu-a", 'bad"name')) is None
    assert host_prefixes(("gpu-a",)).tolist() == [b'{"Host":"gpu-a","Score":']  # type: ignore[union-attr]
