"""``filter`` and ``prioritize`` over the current cluster view, pure of HTTP."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any

import numpy as np

from defrag.extender.state import ClusterCache, ClusterView, StateUnavailable
from defrag.extender.wire import (
    ExtenderArgs,
    encode_priorities,
    encode_priorities_at,
    extender_scores,
)
from defrag.model.arrays import BoolArray, IntArray, NodeArrays
from defrag.model.resources import RESERVED_FOR_ANNOTATION, reservation_admits
from defrag.scoring.filters import filter_masks
from defrag.scoring.scheduler import feasible_mask, node_scores, select, tie_order

log = logging.getLogger(__name__)

R_UNKNOWN_NODE = "node unknown to defrag's cluster state (not relisted yet; relisting now)"


@dataclass(frozen=True, slots=True)
class Candidates:
    """The request's nodes resolved against the view."""

    rows: IntArray
    """Row of each requested node, in request order; -1 for a node the view does not know."""
    unknown: tuple[str, ...]
    reserved: dict[str, str]
    """Node name → pod key, for requested nodes reserved for another pod."""
    exclude: BoolArray
    """[N] rows that are not candidates, or are reserved for another pod."""


class Extender:
    """The two verbs over the current cluster view; pure of HTTP (the server wraps it)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._connection = threading.local()
        """Per connection (each is served on its own thread): ``rows``, the view's names, the
        last request's node names and their rows. kube-scheduler asks ``prioritize`` about the
        nodes ``filter`` passed, on the connection it asked ``filter`` on, and comparing the
        names is cheaper than looking each one up (views of the same nodes share the names,
        whose rows are theirs); another scheduler's requests on another connection in between
        do not take the last request's place."""

    def _view(self, fresh: bool = True) -> ClusterView:
        """The view to answer from. ``fresh``: one with every change the store held when the
        request came (ahead of its build, or waiting for it: :meth:`ClusterCache.view`); else
        the newest there is without waiting (:meth:`ClusterCache.latest`) — what
        ``prioritize`` answers from: kube-scheduler asks it in the same scheduling cycle, right
        after ``filter``, about the nodes the filter passed, and scores them on the snapshot
        the cycle began with; the newest view is at least the one that filter answered from,
        and waiting again for a binding made meanwhile would only put another build in the
        cycle's path."""
        view = self.cache.view() if fresh else self.cache.latest()
        if view is None:
            raise StateUnavailable(str(self.cache.readiness()))
        return view

    def _candidates(self, args: ExtenderArgs, view: ClusterView) -> Candidates:
        arrays = view.arrays
        get = arrays.index.get
        names = args.node_names
        last = getattr(self._connection, "rows", None)
        if last is not None and last[0] is arrays.names and last[1] == names:
            rows = last[2]
        else:
            rows = np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))
            rows.flags.writeable = False
            self._connection.rows = (arrays.names, names, rows)
        known = rows >= 0
        unknown: tuple[str, ...] = ()
        if not known.all():
            unknown = tuple(n for n, k in zip(names, known, strict=True) if not k)
            self.cache.nudge()
        exclude = np.ones(len(arrays), dtype=bool)
        exclude[rows[known]] = False
        reserved_for = dict(view.reserved_for)
        if args.node_objects is not None:
            # The request's node objects are fresher than the last relist.
            for obj in args.node_objects:
                meta = obj.get("metadata") or {}
                annotations = meta.get("annotations") or {}
                value = annotations.get(RESERVED_FOR_ANNOTATION, "")
                if isinstance(value, str) and value.strip():
                    reserved_for[meta["name"]] = value.strip()
                else:
                    reserved_for.pop(meta["name"], None)
        reserved: dict[str, str] = {}
        for name, key in reserved_for.items():
            row = get(name)
            if not reservation_admits(key, args.pod) and row is not None and not exclude[row]:
                reserved[name] = key
        for name in reserved:
            exclude[arrays.index[name]] = True
        return Candidates(rows, unknown, reserved, exclude)

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        """An ExtenderFilterResult: the nodes that fit, and a reason for each that does not."""
        view = self._view()
        cand = self._candidates(args, view)
        failed: dict[str, str] = dict.fromkeys(cand.unknown, R_UNKNOWN_NODE)
        unresolvable = {
            name: f"node reserved for {key} ({RESERVED_FOR_ANNOTATION})"
            for name, key in cand.reserved.items()
        }
        mask = feasible_mask(args.pod, view.arrays, cand.exclude)
        if len(mask):
            passes = (cand.rows >= 0) & mask[cand.rows]  # rows of -1: masked by the first term
        else:  # a cluster of no nodes: every requested node is unknown (and mask[-1] would fail)
            passes = np.zeros(len(cand.rows), dtype=bool)
        if args.unmodelled:  # not defrag's to judge: only reserved nodes are refused
            failed = {}
            passes = np.array([n not in unresolvable for n in args.node_names], dtype=bool)
        passed = list(compress(args.node_names, passes.tolist()))
        judged = ~passes & (cand.rows >= 0)
        if unresolvable:
            judged &= np.fromiter(
                (n not in unresolvable for n in args.node_names), bool, len(args.node_names)
            )
        if judged.any():
            failed.update(self._reasons(args, view.arrays, cand.rows, judged))
        # Every field, in ExtenderFilterResult's order, as Go's json.Marshal writes it: the node
        # list in the request's mode, the other one null (kube-scheduler reads NodeNames when
        # nodeCacheCapable and it is non-null, else Nodes).
        nodes: dict[str, Any] | None = None
        names: list[str] | None = passed
        if args.node_objects is not None:
            keep = set(passed)
            items = [o for o in args.node_objects if o["metadata"]["name"] in keep]
            nodes, names = {"metadata": {}, "items": items}, None
        return {
            "Nodes": nodes,
            "NodeNames": names,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": "",
        }

    @staticmethod
    def _reasons(
        args: ExtenderArgs, arrays: NodeArrays, rows: IntArray, judged: BoolArray
    ) -> dict[str, str]:
        """Why each ``judged`` node of the request fails: the filter's own reasons
        (``filter_reasons``' for these rows only: a request names a few hundred of the
        cluster's nodes), without scoring — a filter call never draws from the profile's score
        function (``random`` answers prioritize as `defrag place` does). The nodes that fail
        the same filters share one text."""
        masks = filter_masks(args.pod, arrays)
        at = rows[judged]
        # each node's failed filters as the bits of one number: filter i is bit i
        failing = np.array([~mask[at] for _reason, mask in masks], dtype=np.int64)
        bits = (1 << np.arange(len(masks), dtype=np.int64)) @ failing
        patterns, which = np.unique(bits, return_inverse=True)
        texts = [
            "; ".join(r for i, (r, _m) in enumerate(masks) if pattern >> i & 1) or "does not fit"
            for pattern in patterns.tolist()
        ]
        names = compress(args.node_names, judged.tolist())
        return dict(zip(names, map(texts.__getitem__, which.reshape(-1).tolist()), strict=True))

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        """A HostPriorityList: every requested node with a 0..10 score (see the module doc)."""
        values = self.scores(args).tolist()
        return [
            {"Host": name, "Score": value}
            for name, value in zip(args.node_names, values, strict=True)
        ]

    def scores(self, args: ExtenderArgs) -> IntArray:
        """The 0..10 score of each requested node, in request order."""
        return self._scored(args)[1]

    def prioritize_body(self, args: ExtenderArgs) -> bytes:
        """The HostPriorityList of :meth:`prioritize`, encoded (one vectorised step when the
        view's node names need no JSON escaping)."""
        view, values, rows = self._scored(args)
        if view.hosts is None:
            return encode_priorities(args.node_names, values.tolist())
        return encode_priorities_at(view.hosts, rows, args.node_names, values)

    def _scored(self, args: ExtenderArgs) -> tuple[ClusterView, IntArray, IntArray]:
        """(the view, each requested node's 0..10 score, its row in the view or -1)."""
        view = self._view(fresh=False)
        if args.unmodelled:
            get = view.arrays.index.get
            at = np.fromiter((get(n, -1) for n in args.node_names), np.int64)
            return view, np.zeros(len(args.node_names), dtype=np.int64), at
        cand = self._candidates(args, view)
        arrays = view.arrays
        feasible = feasible_mask(args.pod, arrays, cand.exclude)
        scores = node_scores(args.pod, arrays, view.policy, feasible) if feasible.any() else None
        known = cand.rows >= 0
        rows = np.where(known, cand.rows, 0)
        if scores is None:
            return view, np.zeros(len(rows), dtype=np.int64), cand.rows
        # The winner by the scheduler's own selection (scheduler.select, as schedule() picks),
        # over the very scores returned (a random policy scored twice would disagree with itself).
        choice = select(scores, feasible, tie_order(args.pod, arrays, view.policy))
        ok = known & feasible[rows]
        per_node = np.where(ok, scores[rows], np.nan)
        winner = ok & (rows == choice) if choice is not None else np.zeros(len(rows), dtype=bool)
        return view, extender_scores(per_node, winner), cand.rows
