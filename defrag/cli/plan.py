"""``defrag plan``: a one-shot plan for a cluster snapshot, as a table, JSON or YAML."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from defrag.cli.app import (
    DEFAULT_DEADLINE,
    ContextOpt,
    DeadlineOpt,
    KubeconfigOpt,
    Output,
    OutputOpt,
    StrictOpt,
    UserError,
    app,
    command_deadline,
    load_cluster,
    parse_duration,
    parse_time,
    print_data,
    print_line,
    print_table,
)
from defrag.cli.names import GOALS
from defrag.cli.profile import PolicyOpt, SettingsOpt, profile_config

if TYPE_CHECKING:  # the planner (numpy) is imported when the command runs
    from defrag.plan import Plan


class GoalChoice(StrEnum):
    repack = "repack"
    make_room = "make-room"
    all = "all"


assert tuple(g.value for g in GoalChoice) == GOALS


@app.command("plan")
def plan_command(
    snapshot: Annotated[
        list[Path],
        typer.Option(
            "--snapshot", "-s", help="JSON/YAML of `kubectl get nodes,pods,pdb -A -o json`."
        ),
    ] = [],  # noqa: B006 - typer needs a literal default
    strict: StrictOpt = False,
    goal: Annotated[GoalChoice, typer.Option(help="repack, make-room or all.")] = GoalChoice.all,
    max_evictions: Annotated[
        int, typer.Option(min=0, help="Evictions the plan may use (its budget).")
    ] = 50,
    max_per_node: Annotated[
        int | None, typer.Option(min=0, help="Evictions per node (default: no limit).")
    ] = None,
    max_per_namespace: Annotated[
        int | None, typer.Option(min=0, help="Evictions per namespace (default: no limit).")
    ] = None,
    min_age: Annotated[
        str,
        typer.Option(help="How long a pod must have run before it may move (15m, 2h; bare: min)."),
    ] = "10m",
    protect_priority: Annotated[
        int | None, typer.Option(help="Pods at or above this priority never move.")
    ] = None,
    no_preempt: Annotated[
        bool, typer.Option("--no-preempt", help="Make-room migrates only, never preempts.")
    ] = False,
    policy: PolicyOpt = None,
    settings_file: SettingsOpt = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            "--now",
            help="The planning time, RFC 3339 or unix seconds (default: now); ages and costs "
            "use it. --now is the old name.",
        ),
    ] = None,
    output: OutputOpt = Output.table,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    deadline: DeadlineOpt = DEFAULT_DEADLINE,
) -> None:
    """Plan evictions that defragment the cluster: migrations and preemptions, with reasons."""
    from defrag.plan import Constraints, PlanError, PlanOptions, make_plan

    when = parse_time(at)
    min_age_s = parse_duration(min_age, "--min-age", bare_unit="m")
    config = profile_config(settings_file, policy)
    with command_deadline(deadline, "plan"):  # the API server's answers end by it
        cluster = load_cluster(snapshot, kubeconfig, context, strict)
    constraints = Constraints(
        min_age=timedelta(seconds=min_age_s),
        protect_priority=protect_priority,
        max_evictions=max_evictions,
        max_per_node=max_per_node,
        max_per_namespace=max_per_namespace,
    )
    try:
        plan = make_plan(
            cluster,
            goal.value,
            profile=config.for_cluster(cluster),
            constraints=constraints,
            now=when,
            options=PlanOptions(preempt=not no_preempt),
        )
    except PlanError as exc:
        raise UserError(str(exc)) from None
    if output is not Output.table:
        # The plan document round-trips (Plan.from_dict); what the snapshot could not model
        # rides beside it, only when there is something to say.
        extra = {"warnings": list(cluster.warnings)} if cluster.warnings else {}
        print_data({**plan.to_dict(), **extra}, output)
    else:
        _print_table(plan)


def _print_table(plan: Plan) -> None:
    before, after = plan.before, plan.after
    print_line(
        f"[bold]{plan.id}[/] goal {plan.goal}, policy {plan.policy}: "
        f"{plan.migrations} migration(s), {plan.preemptions} preemption(s), "
        f"cost {plan.cost:.1f}"
    )
    for target in plan.targets:
        print_line(f"  for {target}")
    steps = Table(title="Steps", show_header=True)
    for col in ("#", "kind", "pod", "from", "to", "GPUs", "cost", "reason"):
        steps.add_column(
            col,
            justify="right" if col in ("#", "GPUs", "cost") else "left",
            overflow="fold",
        )
    for i, s in enumerate(plan.steps, start=1):
        steps.add_row(
            str(i), s.kind, s.pod, s.source, s.target or "(waits)",
            f"{s.gpus_held:g}", f"{s.cost:.1f}", s.reason,
        )  # fmt: skip
    if plan.steps:
        print_table(steps)
    else:
        print_line("No steps: nothing to move within the constraints.")
    if plan.blocked:
        blocked = Table(title="Blocked", show_header=True)
        for col in ("pod", "constraint", "detail"):
            blocked.add_column(col)
        for b in plan.blocked:
            blocked.add_row(b.pod, b.constraint, b.detail)
        print_table(blocked)
    gain = Table(title="Expected gain", show_header=True)
    for col in ("metric", "before", "after"):
        gain.add_column(col, justify="left" if col == "metric" else "right")
    for key in ("free_gpus", "whole_free_nodes", "largest_placeable_job", "fgd_fragmented_gpus"):
        gain.add_row(key, str(before.get(key, "")), str(after.get(key, "")))
    for k, v in dict(before.get("placeable", {})).items():
        gain.add_row(
            f"{k}-GPU jobs placeable", str(v), str(dict(after.get("placeable", {})).get(k))
        )
    print_table(gain)
