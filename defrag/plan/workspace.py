"""The planner's scratch state: mutable free resources and the pod on each seat, with undo.

A plan is made by trying moves on a :class:`Workspace` — remove victims, place them where the
scheduler would — and rolling back what does not work out. The workspace owns a copy of the
arrays, so neither the :class:`~defrag.model.cluster.Cluster` nor the simulator's state it was
made from changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

import numpy as np

from defrag.model.arrays import BoolArray, IntArray, NodeArrays
from defrag.model.cluster import Cluster
from defrag.model.resources import RESERVED_FOR_ANNOTATION, Pod, reservation_admits
from defrag.plan.seating import Occupant, Seat, held, seating

_STATES = itertools.count(1)
"""Numbers for workspace states, unique across every workspace of the process."""


class Workspace:
    """Free resources (``arrays``) and the running pods of each row, changed with an undo log.

    ``no_target`` marks rows the plan keeps out of reach for re-placed pods (a node being
    drained, a node whose room is reserved for a starved pod).

    ``version`` names the state: every change gives a new number (unique across workspaces),
    and a rollback gives back the number of the state it restores — so what was derived from
    the state (a room search's answer) can be kept under its version and found again once a
    trial move is undone. It holds only while every change goes through these methods.
    """

    def __init__(
        self,
        arrays: NodeArrays,
        rows: Iterable[Mapping[str, Occupant]],
        gangs: Mapping[str, tuple[str, ...]] | None = None,
        where: Mapping[str, Occupant] | None = None,
        gpuless_cpu: IntArray | None = None,
        moved: frozenset[str] = frozenset(),
        terminating: frozenset[str] | None = None,
    ) -> None:
        self.arrays = arrays
        self.rows: list[dict[str, Occupant]] = [dict(r) for r in rows]
        self.where: dict[str, Occupant] = (
            dict(where) if where is not None else {k: o for r in self.rows for k, o in r.items()}
        )
        self.gangs: Mapping[str, tuple[str, ...]] = gangs or {}
        self.gpuless_cpu: IntArray = (
            gpuless_cpu.copy()
            if gpuless_cpu is not None
            else cpu_of_gpuless(self.where.values(), len(arrays))
        )
        """[N] CPU (milli) held per row by the running pods that ask no GPU slot (they fit
        almost anywhere: make-room counts it as nearly free); computed from ``where`` unless
        the caller has it."""
        self.no_target: BoolArray = np.zeros(len(arrays), dtype=bool)
        self.reserved: dict[str, Occupant] = {}
        """Pending pods given room by the plan (released before the ``after`` report)."""
        self.reserved_for: dict[int, str] = {}
        """Rows whose node carries a ``defrag.io/reserved-for`` (its value): a room an earlier
        cycle, or another leader, made and is keeping for the pods it names."""
        self._log: list[tuple[str, Occupant]] = []
        self._versions: list[int] = []
        """The version before each change of ``_log``."""
        self.version = next(_STATES)
        self._terminating = (
            terminating
            if terminating is not None
            else frozenset(k for k, o in self.where.items() if o.pod.terminating)
        )
        self._initial: dict[str, Occupant] = dict(self.where)
        """Every running pod's seat before the plan: a pod no longer in its own has been moved
        (:meth:`moved`); a rollback puts the same seat back."""
        self._moved_before = moved
        """Pods the plan moved before this workspace was made of another (:meth:`moved_keys`)."""
        """The running pods that are Terminating: the planner never places one, so the set is
        known once (a room search asks :meth:`leaving` for every pod)."""

    @classmethod
    def from_cluster(cls, cluster: Cluster) -> Workspace:
        """A workspace on a copy of the cluster's arrays, its running pods seated as the kept
        seating has them (:func:`~defrag.plan.seating.seating`: brought up to this cluster)."""
        arrays = cluster.arrays.copy()
        with held():  # the kept seating is copied before another plan may change it
            seated = seating(cluster)
            ws = cls(
                arrays,
                seated.rows,
                dict(seated.gangs),
                where=seated.where,
                gpuless_cpu=seated.gpuless_cpu,
                terminating=frozenset(seated.terminating),
            )
        index = arrays.index
        ws.reserved_for = {
            index[n.name]: n.annotations[RESERVED_FOR_ANNOTATION]
            for n in cluster.nodes
            if n.annotations.get(RESERVED_FOR_ANNOTATION) and n.name in index
        }
        return ws

    # --- queries -----------------------------------------------------------------------------

    def seat(self, key: str) -> Occupant | None:
        return self.where.get(key)

    def node(self, row: int) -> str:
        return self.arrays.names[row]

    def occupants(self, row: int) -> list[Occupant]:
        return sorted(self.rows[row].values(), key=lambda o: o.pod.key)

    def gang_members(self, gang: str) -> tuple[str, ...]:
        return self.gangs.get(gang, ())

    def kept_for_another(self, row: int, pod: Pod) -> bool:
        """Whether ``row``'s node is reserved, and not for ``pod`` (the extender keeps ``pod``
        off it)."""
        value = self.reserved_for.get(row)
        return value is not None and not reservation_admits(value, pod)

    def moved(self, key: str) -> bool:
        """Whether this plan has already moved the running pod ``key``: on the cluster it is a
        new pod by then (its controller's replacement, under another name), so no later step of
        the plan may evict it again."""
        if key in self._moved_before:
            return True
        seat = self.where.get(key)
        return seat is not None and seat is not self._initial.get(key)

    def moved_keys(self) -> frozenset[str]:
        """Every pod :meth:`moved` says this plan has moved (for a workspace made of this one)."""
        now = {k for k, seat in self.where.items() if seat is not self._initial.get(k)}
        return self._moved_before | now

    def leaving(self) -> list[int]:
        """Rows holding a pod that is Terminating (its resources come free once it is gone)."""
        return sorted({self.where[k].row for k in self._terminating if k in self.where})

    # --- changes (logged) ----------------------------------------------------------------------

    def remove(self, key: str) -> Occupant:
        seat = self.where.pop(key)
        del self.rows[seat.row][key]
        self.arrays.release(seat.row, seat.pod, seat.gpus)
        self._count(seat, -1)
        self._logged("remove", seat)
        return seat

    def place(self, pod: Pod, row: int, gpus: tuple[int, ...]) -> Occupant:
        seat = Seat(pod, row, tuple(gpus))
        self.arrays.allocate(row, pod, seat.gpus)
        self.rows[row][pod.key] = seat
        self.where[pod.key] = seat
        self._count(seat, 1)
        self._logged("place", seat)
        return seat

    def reserve(self, pod: Pod, row: int, gpus: tuple[int, ...]) -> None:
        """Give a pending pod its room (it holds resources, but is not a running pod)."""
        seat = Seat(pod, row, tuple(gpus))
        self.arrays.allocate(row, pod, seat.gpus)
        self.reserved[pod.key] = seat
        self._logged("reserve", seat)

    def forbid(self, row: int) -> None:
        if not self.no_target[row]:
            self.no_target[row] = True
            self._logged("forbid", Seat(Pod(name=""), row, ()))

    def _count(self, seat: Occupant, sign: int) -> None:
        if seat.pod.num_gpu == 0:
            self.gpuless_cpu[seat.row] += sign * seat.pod.cpu_milli

    def _logged(self, kind: str, seat: Occupant) -> None:
        self._log.append((kind, seat))
        self._versions.append(self.version)
        self.version = next(_STATES)

    def mark(self) -> int:
        return len(self._log)

    def rollback(self, mark: int) -> None:
        while len(self._log) > mark:
            kind, seat = self._log.pop()
            self.version = self._versions.pop()
            if kind == "remove":
                self.arrays.allocate(seat.row, seat.pod, seat.gpus)
                self.rows[seat.row][seat.pod.key] = seat
                self.where[seat.pod.key] = seat
                self._count(seat, 1)
            elif kind == "place":
                self.arrays.release(seat.row, seat.pod, seat.gpus)
                del self.rows[seat.row][seat.pod.key]
                del self.where[seat.pod.key]
                self._count(seat, -1)
            elif kind == "reserve":
                self.arrays.release(seat.row, seat.pod, seat.gpus)
                del self.reserved[seat.pod.key]
            else:
                self.no_target[seat.row] = False

    def release_reservations(self) -> None:
        """Take back every reservation (the ``after`` state has pending pods still pending)."""
        for seat in self.reserved.values():
            self.arrays.release(seat.row, seat.pod, seat.gpus)
        self.reserved.clear()
        self._log.clear()
        self._versions.clear()
        self.version = next(_STATES)


def cpu_of_gpuless(seats: Iterable[Occupant], rows: int) -> IntArray:
    """[rows] CPU (milli) held per row by those of ``seats`` whose pod asks no GPU slot."""
    cpu = np.zeros(rows, dtype=np.int64)
    for o in seats:
        if o.pod.num_gpu == 0:
            cpu[o.row] += o.pod.cpu_milli
    return cpu
