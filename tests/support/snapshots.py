"""The snapshot fixtures in tests/fixtures/snapshots/, built from real-shaped objects.

``python -m tests.support.snapshots`` rewrites the files; tests check they are in sync.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import kubeobjects as k

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"


def worked_example() -> dict[str, Any]:
    """docs/concepts.md's worked example: node-1 has 1 of 8 GPUs free, node-2 8, node-3 4."""
    return k.as_list(
        [
            k.node("node-1"),
            k.node("node-2"),
            k.node("node-3"),
            k.pod("train-a-0", "ml", 4, node_name="node-1", owner=("Job", "train-a")),
            k.pod("train-b-0", "ml", 2, node_name="node-1", owner=("Job", "train-b")),
            k.pod("serve-7d9f-x2k4p", "serving", 1, node_name="node-1"),
            k.pod("train-c-0", "ml", 4, node_name="node-3", owner=("Job", "train-c")),
        ]
    )


def scattered_20() -> dict[str, Any]:
    """The seed scenario: 20 free GPUs, one or two per 8-GPU node, and an 8-GPU job Pending.

    gpu-01..06 run 4 + 2 GPUs (2 free each: 12); gpu-07..14 run 4 + 2 + 1 (1 free each: 8).
    """
    items: list[dict[str, Any]] = []
    for i in range(1, 15):
        name = f"gpu-{i:02d}"
        items.append(k.node(name))
        sizes = (4, 2) if i <= 6 else (4, 2, 1)
        for j, size in enumerate(sizes):
            if size == 1:
                items.append(
                    k.pod(f"serve-7d9f-{i:02d}", "serving", 1, node_name=name, priority=100)
                )
            else:
                job = f"batch-{i:02d}-{j}"
                items.append(
                    k.pod(
                        f"{job}-0",
                        "ml",
                        size,
                        node_name=name,
                        owner=("Job", job),
                        labels={"job-name": job},
                        cpu="16",
                        memory="128Gi",
                    )
                )
    items.append(
        k.pod(
            "llm-train-0",
            "research",
            8,
            cpu="64",
            memory="512Gi",
            priority=1000,
            priority_class="training-high",
            owner=("Job", "llm-train"),
            labels={"job-name": "llm-train"},
            created="2026-11-29T06:00:00Z",
            pending_message="0/14 nodes are available: 14 Insufficient nvidia.com/gpu. "
            "preemption: 0/14 nodes are available: 14 No preemption victims found.",
        )
    )
    items.append(k.pdb("serve", "serving", match_labels={"app": "serve-7d9f"}))
    return k.as_list(items)


def nvlink() -> dict[str, Any]:
    """Two nodes with NVLink domains 0-3 and 4-7: nvl-a has GPUs {2,3,4,5} free, nvl-b {4,5,6,7}."""
    gi = "defrag.io/gpu-indices"
    return k.as_list(
        [
            k.node("nvl-a", nvlink="0-3,4-7"),
            k.node("nvl-b", nvlink="0-3,4-7"),
            k.pod("a-low", "ml", 2, node_name="nvl-a", annotations={gi: "0,1"}),
            k.pod("a-high", "ml", 2, node_name="nvl-a", annotations={gi: "6-7"}),
            k.pod("b-low", "ml", 4, node_name="nvl-b", annotations={gi: "0-3"}),
        ]
    )


ALL: dict[str, Callable[[], dict[str, Any]]] = {
    "worked_example.json": worked_example,
    "scattered_20.json": scattered_20,
    "nvlink.json": nvlink,
}


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=4) + "\n"


def main() -> None:
    for name, build in ALL.items():
        (FIXTURES / name).write_text(render(build()), encoding="utf-8")
        print(FIXTURES / name)


if __name__ == "__main__":
    main()
