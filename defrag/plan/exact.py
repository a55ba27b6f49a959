"""The exact check: the minimum-cost way to make room, as a MILP (scipy ``milp``, HiGHS).

For clusters up to ~50 nodes this bounds how far the greedy planner is from optimal. The model
makes room for ``jobs`` jobs of ``size`` whole GPUs (and ``cpu_milli`` / ``memory_mib`` each):

* ``x[p, n]`` — movable pod p ends on node n (``x[p, home]`` = it stays, at no cost);
* ``z[p]`` — p is preempted (only when preemption is allowed);
* ``y[n]`` — node n keeps room for one job.

Subject to: every movable pod on exactly one node (or preempted); per node, GPUs, CPU and
memory of the pods there plus the reserved jobs fit the capacity left by the pods that cannot
move; at least ``jobs`` reservations; PDBs (evictions of the pods a PDB selects ≤ its
``disruptionsAllowed``); gangs (all members stay or all move); the per-plan budget. The
objective is the sum of eviction costs, plus the extra of preemption.

GPU capacity is counted per node (GPU-sharing pods by their share), so the optimum is a
*lower bound*: it ignores which GPU slots and NVLink domains pods take, and it may send a pod
where the scheduler would not. A heuristic plan's cost divided by it over-states the gap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from defrag.model.cluster import Cluster
from defrag.model.resources import Pod
from defrag.model.units import GPU_MILLI
from defrag.plan.config import Constraints
from defrag.plan.constraints import check_pod, gang_of
from defrag.plan.cost import DEFAULT_COST, CostModel
from defrag.scoring.filters import node_mask


@dataclass(frozen=True, slots=True)
class ExactResult:
    """The optimum: its cost, the pods it moves (``to`` node) and preempts; or why none."""

    feasible: bool
    cost: float
    moves: tuple[tuple[str, str, str], ...]  # (pod, from, to)
    preempted: tuple[str, ...]
    rooms: tuple[str, ...]
    status: str

    @property
    def evictions(self) -> int:
        return len(self.moves) + len(self.preempted)


def exact_room(
    cluster: Cluster,
    *,
    size: int,
    jobs: int = 1,
    cpu_milli: int = 0,
    memory_mib: int = 0,
    below_priority: int | None = None,
    preempt: bool = False,
    constraints: Constraints = Constraints(),
    now: datetime | None = None,
    cost_model: CostModel = DEFAULT_COST,
    time_limit_s: float = 30.0,
) -> ExactResult:
    """The cheapest set of evictions that leaves ``jobs`` nodes with room for a ``size``-GPU job.

    ``below_priority``: only pods of strictly lower priority may move (make-room's rule).
    """
    a = cluster.arrays
    n_nodes = len(a)
    gpu_left = a.gpu_total.astype(np.float64) * GPU_MILLI
    cpu_left = a.cpu_total.astype(np.float64)
    mem_left = a.mem_total.astype(np.float64)
    movable: list[Pod] = []
    for pod in sorted(cluster.bound_pods(), key=lambda p: p.key):
        row = a.index[pod.node]  # type: ignore[index]
        ok = check_pod(pod, constraints, now).ok
        if below_priority is not None and pod.priority >= below_priority:
            ok = False
        if ok:
            movable.append(pod)
        else:
            gpu_left[row] -= pod.gpu_demand_milli
            cpu_left[row] -= pod.cpu_milli
            mem_left[row] -= pod.memory_mib
    # Variables: x[p, n] for allowed pairs, z[p] (if preempt), y[n].
    pairs: list[tuple[int, int]] = []
    for i, pod in enumerate(movable):
        allowed = node_mask(pod, a) & (a.gpu_total >= pod.num_gpu) & a.model_allowed(pod)
        allowed[a.index[pod.node]] = True  # type: ignore[index]
        pairs.extend((i, int(n)) for n in np.flatnonzero(allowed))
    n_x = len(pairs)
    n_z = len(movable) if preempt else 0
    room_ok = a.schedulable & (a.gpu_total >= size)
    n_y = n_nodes
    n_var = n_x + n_z + n_y
    z0, y0 = n_x, n_x + n_z
    home = {i: a.index[p.node] for i, p in enumerate(movable)}  # type: ignore[index]
    stay_var = {i: k for k, (i, n) in enumerate(pairs) if n == home[i]}
    costs = [cost_model.eviction(p, now) for p in movable]

    c = np.zeros(n_var)
    const = 0.0
    for i, k in stay_var.items():
        c[k] -= costs[i]  # cost × (1 − stay)
        const += costs[i]
    for i, pod in enumerate(movable[:n_z]):
        c[z0 + i] = cost_model.preemption(pod, now) - costs[i]

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(low)
        hi.append(high)

    by_pod: dict[int, list[int]] = defaultdict(list)
    by_node: dict[int, list[int]] = defaultdict(list)
    for k, (i, n) in enumerate(pairs):
        by_pod[i].append(k)
        by_node[n].append(k)
    for i in range(len(movable)):
        entries = [(k, 1.0) for k in by_pod[i]]
        if preempt:
            entries.append((z0 + i, 1.0))
        add(entries, 1.0, 1.0)
    for n in range(n_nodes):
        ks = by_node[n]
        held = [movable[pairs[k][0]] for k in ks]
        job = (size * GPU_MILLI, cpu_milli, memory_mib)
        for dim, (left, need) in enumerate(zip((gpu_left, cpu_left, mem_left), job, strict=True)):
            demand = [_demand(p, dim) for p in held]
            add([*zip(ks, demand, strict=True), (y0 + n, float(need))], -np.inf, float(left[n]))
    add([(y0 + n, 1.0) for n in range(n_nodes)], float(jobs), np.inf)
    for pdb in cluster.pdbs:
        members = [i for i, p in enumerate(movable) if pdb.selects(p)]
        if members:
            # Σ (1 − stay) ≤ allowed  ⇔  Σ stay ≥ |members| − allowed
            add(
                [(stay_var[i], 1.0) for i in members],
                len(members) - pdb.disruptions_allowed,
                np.inf,
            )
    gangs: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(movable):
        gang = gang_of(p)
        if gang:
            gangs[gang].append(i)
    for gang, members in gangs.items():
        all_members = [p for p in cluster.pods.values() if gang_of(p) == gang and p.node]
        if len(all_members) > len(members):
            for i in members:  # a member that may not move pins the whole gang
                add([(stay_var[i], 1.0)], 1.0, 1.0)
            continue
        for i in members[1:]:
            add([(stay_var[members[0]], 1.0), (stay_var[i], -1.0)], 0.0, 0.0)
    if constraints.budget.total is not None:
        add([(k, 1.0) for k in stay_var.values()], len(movable) - constraints.budget.total, np.inf)

    upper = np.ones(n_var)
    upper[y0:] = room_ok.astype(np.float64)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(lo), n_var)).tocsr()
    result = milp(
        c,
        constraints=LinearConstraint(matrix, np.array(lo), np.array(hi)),
        integrality=np.ones(n_var),
        bounds=Bounds(np.zeros(n_var), upper),
        options={"time_limit": time_limit_s},
    )
    if result.x is None:
        return ExactResult(False, float("inf"), (), (), (), str(result.message))
    x = np.rint(result.x).astype(int)
    moves = tuple(
        (movable[i].key, a.names[home[i]], a.names[n])
        for k, (i, n) in enumerate(pairs)
        if x[k] and n != home[i]
    )
    preempted = tuple(movable[i].key for i in range(n_z) if x[z0 + i])
    rooms = tuple(a.names[n] for n in range(n_nodes) if x[y0 + n])
    return ExactResult(
        True, round(float(result.fun) + const, 6), moves, preempted, rooms, str(result.message)
    )


def _demand(pod: Pod, dim: int) -> float:
    return float((pod.gpu_demand_milli, pod.cpu_milli, pod.memory_mib)[dim])
