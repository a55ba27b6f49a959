"""The node agent against a real NVIDIA driver: one prepared check for a machine with a GPU.

Not a test (CI has no GPU). It reads the GPUs through the real ``nvidia-ml-py`` with defrag's
:class:`~defrag.adapters.nvml.NvmlInventory`, derives the NVLink topology and the annotation the
agent would publish, renders the agent's metrics, then holds GPU memory from this process (with
PyTorch when it is installed) and checks that NVML's used memory and per-process accounting see
it. Prints one JSON document and exits non-zero when a check fails::

    python -m bench.nvml_device_check [--hold-gib 4] [--out result.json]

Needs only numpy, nvidia-ml-py and prometheus-client (no Kubernetes client: nothing is patched).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from defrag.adapters.nvml import NvmlInventory, NvmlUnavailable
from defrag.agent.service import Agent
from defrag.agent.topology import read_topology


def _hold(gib: float) -> Any:
    """A tensor of ``gib`` GiB on GPU 0, or None without PyTorch/CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-gib", type=float, default=4.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result: dict[str, Any] = {"checks": {}}
    checks = result["checks"]
    inv = NvmlInventory()
    try:
        inv.open()
    except NvmlUnavailable as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    try:
        result["driver"] = inv.driver_version()
        before = inv.devices()
        result["devices"] = [
            {
                "index": d.index, "uuid": d.uuid, "name": d.name, "bus_id": d.bus_id,
                "memory_total_mib": d.memory_total_mib, "memory_used_mib": d.memory_used_mib,
                "links": len(d.links), "processes": len(d.processes),
            }
            for d in before
        ]  # fmt: skip
        topology = read_topology(before)
        result["topology"] = topology.to_dict()
        checks["devices_found"] = len(before) > 0
        checks["indices_dense"] = [d.index for d in before] == list(range(len(before)))
        checks["uuids_unique"] = len({d.uuid for d in before}) == len(before)
        checks["memory_sane"] = all(0 <= d.memory_used_mib <= d.memory_total_mib for d in before)
        covered = sorted(i for group in topology.domains for i in group)
        checks["every_gpu_in_one_domain"] = covered == list(range(len(before)))

        node = os.environ.get("NODE_NAME", "device-check")
        agent = Agent(node=node, inventory=inv, annotator=None)
        synced = agent.sync_once()
        metrics = generate_latest(agent.registry).decode()
        result["metrics_lines"] = [ln for ln in metrics.splitlines() if ln.startswith("defrag_")]
        checks["metrics_per_gpu"] = (
            all(f'uuid="{d.uuid}"' in metrics for d in before)
            and "defrag_gpu_memory_total_bytes" in metrics
        )
        checks["agent_topology_matches"] = synced.annotation == topology.annotation

        held = _hold(args.hold_gib)
        result["held_gib"] = args.hold_gib if held is not None else 0
        if held is not None:
            time.sleep(1.0)  # NVML's accounting follows the allocation within a moment
            after = inv.devices()
            grew = after[0].memory_used_mib - before[0].memory_used_mib
            result["used_growth_mib"] = grew
            checks["used_memory_follows_allocation"] = grew >= 0.9 * args.hold_gib * 1024
            mine = [p for p in after[0].processes if p.pid == os.getpid()]
            result["own_process"] = [{"pid": p.pid, "used_mib": p.used_mib} for p in mine]
            # Under some sandboxes NVML cannot map PIDs (the container's PID namespace): say so.
            checks["own_process_listed"] = bool(mine) or not after[0].processes
            del held
    finally:
        inv.close()
    result["ok"] = all(checks.values())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
