"""``defrag plan``: a one-shot plan for a cluster snapshot, as a table, JSON or YAML."""

from __future__ import annotations

from collections.abc import Mapping
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
    load_live_cluster,
    parse_duration,
    parse_time,
    print_data,
    print_line,
    print_table,
)
from defrag.cli.names import GOALS
from defrag.cli.profile import PolicyOpt, SettingsOpt

if TYPE_CHECKING:  # the planner (numpy) is imported when the command runs
    from defrag.plan import Plan, PlannerConfig
    from defrag.scoring.profile import ProfileConfig


class GoalChoice(StrEnum):
    """The plan goals (= :class:`defrag.plan.Goal`, spelt here so ``--help`` imports no numpy;
    tests/test_cli_lazy_imports.py checks the two agree)."""

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
        int | None,
        typer.Option(
            min=0,
            help="Evictions the plan may use (its budget; default: the setting "
            "windows.max_evictions_per_window, 10).",
        ),
    ] = None,
    max_per_node: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Evictions per node (default: the setting windows.max_evictions_per_node, 8).",
        ),
    ] = None,
    max_per_namespace: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Evictions per namespace (default: the setting "
            "windows.max_evictions_per_namespace, 5).",
        ),
    ] = None,
    min_age: Annotated[
        str | None,
        typer.Option(
            help="How long a pod must have run before it may move (15m, 2h; "
            "default: the setting planner.min_pod_age_s, 0).",
            metavar="DURATION",
        ),
    ] = None,
    protect_priority: Annotated[
        int | None,
        typer.Option(
            help="Pods at or above this priority never move (the setting "
            "planner.evict_priority_threshold)."
        ),
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
    from defrag.plan import Goal, PlanError, make_plan
    from defrag.plan.planner import plan_with_owners

    when = parse_time(at)
    # The flags are settings given on the command line: they override the file's (and the
    # environment's) as `--policy` overrides its policy; what no flag sets is the daemon's.
    overrides = {
        "windows.max_evictions_per_window": max_evictions,
        "windows.max_evictions_per_node": max_per_node,
        "windows.max_evictions_per_namespace": max_per_namespace,
        "planner.min_pod_age_s": (
            None if min_age is None else parse_duration(min_age, "--min-age", bare_was="m")
        ),
        "planner.evict_priority_threshold": protect_priority,
    }
    config, planner = plan_configs(settings_file, policy, overrides)
    if no_preempt:
        planner = planner.with_options(mode=planner.options.mode.without_preemption())
    with command_deadline(deadline, "plan"):  # the API server's answers end by it
        cluster, api = load_live_cluster(snapshot, kubeconfig, context, strict)
        how = {"profile": config.for_cluster(cluster), "config": planner, "now": when}
        try:
            if api is None:  # a snapshot holds no owners: their kinds decide
                plan = make_plan(cluster, Goal(goal.value), **how)  # type: ignore[arg-type]
            else:  # as the daemon: every victim's controller read first
                from defrag.adapters.kube_owners import KubeOwnerLookup

                plan = plan_with_owners(cluster, KubeOwnerLookup(api), Goal(goal.value), **how)
        except PlanError as exc:
            raise UserError(str(exc)) from None
    if output is not Output.table:
        # The plan document round-trips (Plan.from_dict); what the snapshot could not model
        # rides beside it, only when there is something to say.
        extra = {"warnings": list(cluster.warnings)} if cluster.warnings else {}
        print_data({**plan.to_dict(), **extra}, output)
    else:
        _print_table(plan)


def plan_configs(
    settings_file: Path | None, policy: str | None, overrides: Mapping[str, object]
) -> tuple[ProfileConfig, PlannerConfig]:
    """The scoring profile and the planner configuration of the settings (file, environment)
    with the flags' ``overrides`` — the daemon's own ``Settings.planner_config()``. A bad
    value is a :class:`UserError` naming the field and where it came from."""
    from defrag.redact import redact_text
    from defrag.settings import SettingsError, load_settings

    try:
        settings = load_settings(settings_file, overrides)
        return settings.profile_config(policy), settings.planner_config()
    except SettingsError as exc:
        raise UserError(redact_text(str(exc))) from None


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
        print_table(steps, drop=("cost", "#"), whole=("pod", "from", "to"))
    else:
        print_line("No steps: nothing to move within the constraints.")
    if plan.blocked:
        blocked = Table(title="Blocked", show_header=True)
        for col in ("pod", "constraint", "detail"):
            blocked.add_column(col)
        for b in plan.blocked:
            blocked.add_row(b.pod, b.constraint, b.detail)
        print_table(blocked, whole=("pod",))
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
