"""Running cluster totals the protocols log after every event: FGD fragmentation.

Only the nodes a placement (or a migration) touched change their fragmentation, so the tracker
recomputes those rows alone.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from defrag.model.arrays import FloatArray, NodeArrays
from defrag.model.units import GPU_MILLI
from defrag.model.workload import WorkloadMix


class FragTracker:
    """FGD fragmentation of every node against ``mix``, kept current row by row (milli-GPU).

    Uses the scoring package's vectorised FGD model (built once) on the changed rows.
    """

    def __init__(self, arrays: NodeArrays, mix: WorkloadMix) -> None:
        from defrag.scoring.fgd_model import FragModel

        self.arrays, self.mix = arrays, mix
        self._model = FragModel.build(mix, arrays.models)
        self.node_frag: FloatArray = self._rows(slice(None))
        self.total = float(self.node_frag.sum())

    def _rows(self, rows: slice | list[int]) -> FloatArray:
        a = self.arrays
        return np.asarray(
            self._model.node_frag(a.gpu_free[rows], a.cpu_free[rows], a.model_code[rows]),
            dtype=np.float64,
        )

    def update(self, rows: Iterable[int]) -> None:
        changed = sorted(set(rows))
        if not changed:
            return
        values = self._rows(changed)
        self.total += float(values.sum() - self.node_frag[changed].sum())
        self.node_frag[changed] = values


def capacity_milli(arrays: NodeArrays) -> int:
    return int(arrays.gpu_total.sum()) * GPU_MILLI
