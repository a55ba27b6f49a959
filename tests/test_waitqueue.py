"""The timeline's waiting queue: which waiting pods may fit a freed node, in queue order.

``may_fit`` is a prefilter (capacity alone: CPU, memory, GPU model, k GPUs with the share free)
whose answer decides which pods the timeline retries; it skips rows where no waiting pod's GPU
ask fits before its vectorised pass. Each test compares it with the rule written out pod by pod.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from defrag.model import Cluster, Node, Pod
from defrag.model.arrays import NodeArrays
from defrag.sim.waitqueue import WaitQueue
from tests.test_scoring_properties import SETTINGS, clusters, pods


def _fits(pod: Pod, arrays: NodeArrays, row: int) -> bool:
    """The prefilter's rule for one pod and one row, the long way."""
    total = int(arrays.gpu_total[row])
    free = arrays.gpu_free[row, :total].tolist()
    gpu_ok = pod.num_gpu == 0 or sum(f >= max(pod.gpu_milli, 1) for f in free) >= pod.num_gpu
    code = int(arrays.model_code[row])
    if pod.num_gpu == 0:
        model_ok = True
    elif code < 0:  # a node without GPUs
        model_ok = False
    else:
        model_ok = not pod.gpu_models or arrays.models[code] in pod.gpu_models
    return (
        gpu_ok
        and pod.cpu_milli <= arrays.cpu_free[row]
        and pod.memory_mib <= arrays.mem_free[row]
        and model_ok
    )


def _expected(queue: WaitQueue, live: list[int], arrays: NodeArrays, rows: set[int]) -> list[str]:
    """Live pods that fit one of ``rows``, higher priority first, then first pushed."""
    hits = [i for i in live if any(_fits(queue.pods[i], arrays, r) for r in rows)]
    return [queue.pods[i].key for i in sorted(hits, key=lambda i: (-queue.pods[i].priority, i))]


@SETTINGS
@given(
    clusters(),
    st.lists(st.tuples(pods("w"), st.integers(0, 2)), min_size=1, max_size=16),
    st.lists(st.integers(0, 15), max_size=8),
    st.data(),
)
def test_may_fit_is_the_rule_pod_by_pod_in_queue_order(
    cluster: Cluster, waiting: list[tuple[Pod, int]], gone: list[int], data: st.DataObject
) -> None:
    arrays = cluster.arrays
    queue = WaitQueue(arrays.models)
    for j, (pod, prio) in enumerate(waiting):
        queue.push(replace(pod, name=f"w{j}", priority=prio))
    live = list(range(len(waiting)))
    for i in sorted({g for g in gone if g < len(waiting)}):
        queue.remove(i)  # removed pods are never answered, and their asks leave the count
        live.remove(i)
    rows = set(data.draw(st.lists(st.integers(0, len(arrays) - 1), min_size=1, max_size=3)))
    got = [queue.pods[i].key for i in queue.may_fit(arrays, rows)]
    assert got == _expected(queue, live, arrays, rows)
    assert queue.count == len(live)


def test_a_row_no_ask_fits_is_dismissed_and_one_that_fits_answers() -> None:
    # Node a: 8 GPUs, 3 of them taken (5 whole free); node b: 8 free. Waiting: an 8-GPU pod
    # and a 6-GPU pod. a fits neither (5 < 6 ≤ 8); b fits both, the older first.
    cluster = Cluster.build(
        [Node("a", 64000, 10**6, 8, "A100"), Node("b", 64000, 10**6, 8, "A100")]
    )
    arrays = cluster.arrays.copy()
    arrays.allocate(0, Pod("x", num_gpu=3), (0, 1, 2))
    queue = WaitQueue(arrays.models)
    queue.push(Pod("eight", num_gpu=8))
    queue.push(Pod("six", num_gpu=6))
    assert queue.may_fit(arrays, {0}) == []
    assert [queue.pods[i].name for i in queue.may_fit(arrays, {0, 1})] == ["eight", "six"]
    queue.remove(0)  # the 8-GPU pod started: a 3-GPU pod now fits node a
    queue.push(Pod("three", num_gpu=3))
    assert [queue.pods[i].name for i in queue.may_fit(arrays, {0})] == ["three"]


def test_compaction_keeps_order_and_answers() -> None:
    # 200 pushes, all but every 10th removed: the columns compact (more removed than live + 64)
    # and the survivors still answer in queue order.
    arrays = Cluster.build([Node("a", 64000, 10**6, 8, "A100")]).arrays
    queue = WaitQueue(arrays.models)
    for j in range(200):
        queue.push(Pod(f"p{j:03d}", num_gpu=1, priority=j % 3))
    for j in range(200):
        if j % 10:
            queue.remove(j)
    found = [queue.pods[i].name for i in queue.may_fit(arrays, {0})]
    kept = [f"p{j:03d}" for j in range(0, 200, 10)]
    assert found == sorted(kept, key=lambda name: (-(int(name[1:]) % 3), name))
    assert len(queue.pods) == 20  # compacted
