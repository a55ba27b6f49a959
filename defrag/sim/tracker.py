"""Running cluster totals the protocols log after every event: allocation and FGD fragmentation.

Only the nodes a placement (or a migration) touched change their fragmentation, so the tracker
recomputes those rows alone, through a one-row view of the arrays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

import numpy as np

from defrag.model.arrays import FloatArray, NodeArrays
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix


def row_view(arrays: NodeArrays, row: int) -> NodeArrays:
    """A one-row NodeArrays; its numpy fields are views sharing memory with ``arrays``.

    Generic over NodeArrays' fields: per-row arrays and tuples are sliced, ``names``/``index``
    and ``tainted_rows`` are renumbered, everything else (``models``) is shared.
    """
    n = len(arrays)
    values: dict[str, object] = {}
    for f in fields(arrays):
        value = getattr(arrays, f.name)
        if f.name == "index":
            values[f.name] = {arrays.names[row]: 0}
        elif f.name == "tainted_rows":
            values[f.name] = (0,) if row in value else ()
        elif isinstance(value, np.ndarray) and value.shape[:1] == (n,):
            values[f.name] = value[row : row + 1]
        elif isinstance(value, tuple) and f.name != "models" and len(value) == n:
            values[f.name] = (value[row],)
        else:
            values[f.name] = value
    return NodeArrays(**values)  # type: ignore[arg-type]


class FragTracker:
    """FGD fragmentation of every node against ``mix``, kept current row by row (milli-GPU)."""

    def __init__(self, arrays: NodeArrays, mix: WorkloadMix) -> None:
        from defrag.scoring.fragmentation import fgd_node_fragmentation

        self._frag_of = fgd_node_fragmentation
        self.arrays, self.mix = arrays, mix
        self.node_frag: FloatArray = np.asarray(fgd_node_fragmentation(arrays, mix), np.float64)
        self.total = float(self.node_frag.sum())

    def update(self, rows: Iterable[int]) -> None:
        for row in set(rows):
            value = float(self._frag_of(row_view(self.arrays, row), self.mix)[0])
            self.total += value - float(self.node_frag[row])
            self.node_frag[row] = value

    def resync(self) -> None:
        """Recompute every row (and the total, free of rounding drift)."""
        self.node_frag = np.asarray(self._frag_of(self.arrays, self.mix), np.float64)
        self.total = float(self.node_frag.sum())


def capacity_milli(arrays: NodeArrays) -> int:
    return int(arrays.gpu_total.sum()) * GPU_MILLI
