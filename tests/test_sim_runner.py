"""A simulation task resolves its names when it is made: a bad name fails before any run."""

from __future__ import annotations

import pytest

from defrag.sim.runner import Task


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "bogus"}, "unknown policy 'bogus'"),
        ({"defragmenter": "bogus"}, "unknown defragmenter 'bogus'"),
        ({"defragmenter": "kai-consolidation", "protocol": "fill"}, "timeline protocol only"),
        ({"protocol": "bogus"}, "unknown protocol 'bogus'"),
    ],
)
def test_a_bad_name_fails_when_the_task_is_made(kwargs: dict[str, str], message: str) -> None:
    args = {"protocol": "timeline", "policy": "fgd", **kwargs}
    with pytest.raises(ValueError, match=message):
        Task(args.pop("protocol"), args.pop("policy"), 42, **args)  # type: ignore[arg-type]


def test_good_names_make_a_task() -> None:
    task = Task("timeline", "least-allocated", 42, defragmenter="kai-consolidation")
    assert task.label == "least-allocated+kai-consolidation"
    assert Task("fill", "fgd", 42, defrag=True).defragmenter == "defrag"
