"""The plan artifact: JSON/YAML round trip, the id, errors that name the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from defrag.plan.model import Blocked, Plan, PlanFormatError, Step

REASON = "make room for ml/job (8 GPU) on n1"


def sample_plan() -> Plan:
    return Plan(
        goal="all",
        policy="reserve-binpack",
        steps=(
            Step("migrate", "ml/a", "n1", "n2", REASON, (0, 1), 2.0, 5.5),
            Step("preempt", "ml/b", "n1", None, REASON, (), 0.5, 3.0, "ml/g"),
        ),
        blocked=(Blocked("serving/s", "pdb", "PodDisruptionBudget serving/s allows 0"),),
        before={"largest_placeable_job": 2, "placeable": {"8": 0}},
        after={"largest_placeable_job": 8, "placeable": {"8": 1}},
        targets=("ml/job (8 GPU)",),
    )  # fmt: skip


def test_json_keys_are_the_issue_contract() -> None:
    data = sample_plan().to_dict()
    assert {"steps", "blocked", "before", "after", "cost"} <= set(data)
    step = data["steps"][0]
    assert {k: step[k] for k in ("pod", "from", "to", "kind", "reason")} == {
        "pod": "ml/a", "from": "n1", "to": "n2", "kind": "migrate",
        "reason": "make room for ml/job (8 GPU) on n1",
    }  # fmt: skip
    assert data["steps"][1]["to"] is None
    assert data["blocked"] == [
        {
            "pod": "serving/s",
            "constraint": "pdb",
            "detail": "PodDisruptionBudget serving/s allows 0",
        }
    ]
    assert data["cost"] == 8.5  # 5.5 + 3.0


@pytest.mark.parametrize(
    "dump,load",
    [
        (lambda d: json.dumps(d), json.loads),
        (lambda d: yaml.safe_dump(d, sort_keys=False), yaml.safe_load),
    ],
    ids=["json", "yaml"],
)
def test_round_trip(dump: Any, load: Any) -> None:
    plan = sample_plan()
    again = Plan.from_dict(load(dump(plan.to_dict())))
    assert again == plan
    assert again.to_dict() == plan.to_dict()


def test_id_is_a_digest_of_content() -> None:
    plan = sample_plan()
    assert plan.id.startswith("plan-") and len(plan.id) == 17
    assert sample_plan().id == plan.id
    shorter = Plan(plan.goal, plan.policy, plan.steps[:1], plan.blocked)
    assert shorter.id != plan.id


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.pop("goal"), "plan.goal: missing"),
        (lambda d: d.__setitem__("steps", {}), "plan.steps: expected a list"),
        (lambda d: d["steps"][0].__setitem__("kind", "move"), "plan.steps[0].kind"),
        (lambda d: d["steps"][0].__setitem__("to", None), "plan.steps[0].to: a migrate step"),
        (lambda d: d["steps"][1].__setitem__("to", "n3"), "plan.steps[1].to: a preempt step"),
        (lambda d: d["steps"][0].__setitem__("cost", "high"), "plan.steps[0].cost"),
        (lambda d: d["blocked"][0].pop("constraint"), "plan.blocked[0].constraint: missing"),
        (lambda d: d.__setitem__("after", [1]), "plan.after: expected a mapping"),
    ],
)
def test_bad_documents_name_the_field(mutate: Any, message: str) -> None:
    data = sample_plan().to_dict()
    mutate(data)
    with pytest.raises(PlanFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Plan.from_dict(data)
