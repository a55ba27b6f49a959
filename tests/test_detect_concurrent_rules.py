"""Rules that read metrics are evaluated together when the source answers queries at once
(``defrag.detection._evaluate``): one rule's queries are with the server while another's answers
are analysed. Outcomes keep the rules' order; a rule's exception stays its own; the caller's
time budget bounds every thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from defrag import detection
from defrag.adapters.deadline import current_budget, time_budget

WAIT_S = 30.0  # a bound on a handshake between two threads, not a timing


class _Detector:
    def __init__(self, run: Any) -> None:
        self.run = run

    def evaluate(self, rule: Any, inputs: Any) -> list[str]:
        return self.run(rule, inputs)


def _ready(names: list[str], metrics: bool = True) -> list[Any]:
    return [
        (i, SimpleNamespace(rule=SimpleNamespace(name=n, detector=n)),
         SimpleNamespace(metrics=object() if metrics else None))
        for i, n in enumerate(names)
    ]  # fmt: skip


def _patch(monkeypatch: pytest.MonkeyPatch, detectors: dict[str, Any]) -> None:
    monkeypatch.setattr(detection.registry, "get", lambda name: _Detector(detectors[name]))


def test_a_rule_waiting_on_another_rules_query_finishes_only_when_evaluated_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``first`` waits for ``second`` to have started: evaluated one after the other, the
    wait would run out (the handshake fails), together it is met."""
    started = threading.Event()

    def first(rule: Any, inputs: Any) -> list[str]:
        return ["first met" if started.wait(WAIT_S) else "first waited in vain"]

    def second(rule: Any, inputs: Any) -> list[str]:
        started.set()
        return ["second"]

    _patch(monkeypatch, {"first": first, "second": second})
    outcomes = detection._evaluate(_ready(["first", "second"]), concurrent=True)
    assert outcomes == [["first met"], ["second"]]


@pytest.mark.parametrize(
    ("concurrent", "metrics", "threads"),
    [
        (True, True, True),  # a concurrent source, two metric rules: each on its own thread
        (False, True, False),  # a plain source: one after the other, on the caller's thread
        (True, False, False),  # rules that read no metrics: on the caller's thread
    ],
)
def test_where_rules_run_and_in_which_order_their_outcomes_come(
    monkeypatch: pytest.MonkeyPatch, concurrent: bool, metrics: bool, threads: bool
) -> None:
    caller = threading.get_ident()

    def named(rule: Any, inputs: Any) -> list[str]:
        if rule.name == "broken":
            raise ValueError("bad query")
        return [f"{rule.name} on {'a thread' if threading.get_ident() != caller else 'caller'}"]

    _patch(monkeypatch, {"a": named, "broken": named, "c": named})
    outcomes = detection._evaluate(_ready(["a", "broken", "c"], metrics), concurrent=concurrent)
    where = "a thread" if threads else "caller"
    assert outcomes[0] == [f"a on {where}"] and outcomes[2] == [f"c on {where}"]
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "bad query"


def test_the_callers_time_budget_bounds_every_rules_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def budget_seen(rule: Any, inputs: Any) -> list[str]:
        budget = current_budget()
        return [f"{budget.what} ≤ 60 s" if budget and budget.remaining() <= 60 else "unbounded"]

    _patch(monkeypatch, {"a": budget_seen, "b": budget_seen})
    with time_budget(60.0, "cycle"):
        outcomes = detection._evaluate(_ready(["a", "b"]), concurrent=True)
    assert outcomes == [["cycle ≤ 60 s"], ["cycle ≤ 60 s"]]
