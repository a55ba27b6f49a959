"""The extender's wire format: kube-scheduler's ``ExtenderArgs`` decoded with encoding/json's
key rules, and its answers' scales and encodings (the package doc has the whole contract)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from defrag.adapters import jsonio
from defrag.adapters.gpu_shapes import ShapeWarning
from defrag.adapters.kube_convert import ConversionError, pod_from_json
from defrag.model.arrays import BoolArray, FloatArray, IntArray
from defrag.model.resources import Pod

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's MaxExtenderPriority: extender scores are 0..10."""
MAX_BODY_BYTES = 80 * 2**20
"""The largest body read: 1.5 × a 5,000-node ``Nodes``-mode request with 50 images per node
(55.2 MB, ``bench/extender_bodies.py``); a ``NodeNames`` request for 5,000 nodes is 61 kB."""
BODY_BUDGET_BYTES = MAX_BODY_BYTES
"""Body bytes read and parsed at once, all requests together (one maximal body at a time)."""
MAX_NESTING = 64
"""JSON nesting deeper than a v1 Pod or Node ever is (a deeper body is refused, not recursed)."""


class BadRequest(ValueError):
    """A body that is not a usable ExtenderArgs; the message goes back with the 400."""


# --- the request ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A parsed ExtenderArgs: the pod, the candidate node names, and (``nodes`` mode) the
    node objects as sent, so that a filter answer can return them untouched."""

    pod: Pod
    node_names: tuple[str, ...]
    node_objects: tuple[Mapping[str, Any], ...] | None = None
    """The v1 Node items when the request carried ``Nodes``; None in ``NodeNames`` mode."""
    unmodelled: str = ""
    """Why defrag cannot model the pod's request (a DRA claim, an unknown accelerator); such a
    pod is not judged: every node passes the filter and scores 0, so kube-scheduler decides."""

    @property
    def node_cache_capable(self) -> bool:
        return self.node_objects is None


ARGS_FIELDS = ("Pod", "Nodes", "NodeNames")
"""``extender/v1.ExtenderArgs``'s fields, in declaration order (no json tags: the keys are the Go
field names)."""
NODE_LIST_FIELDS = ("metadata", "items")
"""The json tags of ``core/v1.NodeList`` that the extender reads."""

# encoding/json's foldName (fold.go): ASCII letters upper-cased, any other rune replaced by the
# smallest rune of its unicode.SimpleFold orbit. Against ASCII field names only two non-ASCII
# runes can match, both listed in unicode's caseOrbit table: KELVIN SIGN (U+212A, orbit K k K)
# and LATIN SMALL LETTER LONG S (U+017F, orbit S s ſ). Every other non-ASCII rune folds to a
# non-ASCII rune and so never matches an ASCII name; it is kept as it is.
_GO_FOLD = str.maketrans(
    {**{chr(c): chr(c - 32) for c in range(ord("a"), ord("z") + 1)}, "\u212a": "K", "\u017f": "S"}
)


def go_fold(name: str) -> str:
    """A JSON key folded as encoding/json folds it, for comparison with an ASCII field name."""
    return name.translate(_GO_FOLD)


class _Pairs(dict[str, Any]):
    """A JSON object that remembers its members in document order, duplicates included."""

    pairs: list[tuple[str, Any]]


def _pairs_hook(pairs: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(pairs)
    obj.pairs = pairs
    return obj


def go_fields(
    obj: Mapping[str, Any], fields: Sequence[str], pairs: Sequence[tuple[str, Any]] | None = None
) -> dict[str, Any]:
    """The value each field of a Go struct receives when ``encoding/json`` decodes ``obj``.

    Go's rule (``decode.go``, ``object()``): for each member in document order, the field whose
    name equals the key exactly, else the field whose folded name equals the folded key; a later
    member for the same field replaces the earlier one; unknown keys are ignored. A field no key
    names is absent from the result; JSON ``null`` comes back as None (a nil pointer). ``pairs``
    are the members in document order with duplicates; without them ``obj``'s items stand in,
    which is exact unless two keys name one field (see :func:`parse_args`).
    """
    exact = {f: f for f in fields}
    folded = {go_fold(f): f for f in reversed(fields)}  # the first declared field wins a tie
    out: dict[str, Any] = {}
    for key, value in pairs if pairs is not None else obj.items():
        name = exact.get(key) or folded.get(go_fold(key))
        if name is not None:
            out[name] = value
    return out


def _collides(obj: Mapping[str, Any], fields: Sequence[str]) -> bool:
    """Whether two keys of ``obj`` name the same field (their order then matters)."""
    wanted = {go_fold(f) for f in fields}
    seen = [go_fold(k) for k in obj if go_fold(k) in wanted]
    return len(seen) != len(set(seen))


def _no_constant(name: str) -> Any:
    raise BadRequest(f"body: {name} is not JSON (Go's encoding/json refuses it)")


def _nesting(body: bytes | bytearray | str) -> int:
    """The deepest ``[``/``{`` nesting outside strings, cheaply (a bound before json.loads).

    Vectorised over the body's bytes: ASCII brackets, quotes and backslashes are never part of
    a multi-byte UTF-8 sequence, so the bytes say what the text says, and most bodies end at the
    first count without being looked at further. A quote ends or starts a string unless an odd
    run of backslashes comes right before it; a bracket is inside a string when an odd number of
    such quotes come before it. That is the JSON grammar's reading wherever backslashes appear
    only inside strings, as in every JSON text; a body with one outside a string is not JSON and
    is refused either way (too deep here, or not JSON by the decoder).
    """
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if raw.count(b"[") + raw.count(b"{") < MAX_NESTING:
        return 0
    data = np.frombuffer(raw, dtype=np.uint8)
    folded = data | 0x20  # '[' → '{', ']' → '}': one comparison for each pair
    opens = np.flatnonzero(folded == ord("{"))
    closes = np.flatnonzero(folded == ord("}"))
    del folded
    quotes = _unescaped(np.flatnonzero(data == ord('"')), np.flatnonzero(data == ord("\\")))
    at = np.concatenate([opens, closes])
    step = np.concatenate(
        [np.ones(len(opens), dtype=np.int64), np.full(len(closes), -1, dtype=np.int64)]
    )
    outside = np.searchsorted(quotes, at) % 2 == 0  # an even number of quotes before it
    at, step = at[outside], step[outside]
    depth = np.cumsum(step[np.argsort(at, kind="stable")])
    return int(depth.max(initial=0))


def _unescaped(quotes: IntArray, backslashes: IntArray) -> IntArray:
    """The positions of the quotes not escaped (not right after an odd run of backslashes)."""
    if not len(backslashes) or not len(quotes):
        return quotes
    # the runs of consecutive backslashes: where each ends and how long it is
    breaks = np.flatnonzero(np.diff(backslashes) != 1)
    ends = np.append(backslashes[breaks], backslashes[-1])
    starts = np.insert(backslashes[breaks + 1], 0, backslashes[0])
    place = np.searchsorted(ends, quotes - 1)
    place_ok = place < len(ends)
    after_run = np.zeros(len(quotes), dtype=bool)
    after_run[place_ok] = ends[place[place_ok]] == quotes[place_ok] - 1
    odd = np.zeros(len(quotes), dtype=bool)
    runs = place[after_run]
    odd[after_run] = (ends[runs] - starts[runs] + 1) % 2 == 1
    return quotes[~odd]


def parse_args(body: bytes | bytearray | str) -> ExtenderArgs:
    """Read an ExtenderArgs body as kube-scheduler's ``encoding/json`` would; :class:`BadRequest`
    names the field that is wrong.

    kube-scheduler sends ``{"Pod": …, "Nodes": null, "NodeNames": [...]}`` (nodeCacheCapable)
    or ``{"Pod": …, "Nodes": {"metadata": {}, "items": [...]}, "NodeNames": null}``; the keys
    match case-insensitively (:func:`go_fields`), so ``{"pod": …, "nodenames": […]}`` is read
    too. The Pod and the Node items are ordinary Kubernetes JSON (lowercase json tags).
    """
    if _nesting(body) > MAX_NESTING:
        raise BadRequest(f"body: JSON nested deeper than {MAX_NESTING} levels")
    try:
        doc = jsonio.loads(body, parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body: expected a JSON object (ExtenderArgs)")
    pairs: list[tuple[str, Any]] | None = None
    if _collides(doc, ARGS_FIELDS):  # e.g. both "Pod" and "pod": the last one wins, as in Go
        pairs = json.loads(body, object_pairs_hook=_pairs_hook, parse_constant=_no_constant).pairs
    args = go_fields(doc, ARGS_FIELDS, pairs)
    raw_pod = args.get("Pod")
    if not isinstance(raw_pod, dict):
        what = "null" if "Pod" in args and raw_pod is None else "missing or not an object"
        raise BadRequest(f"Pod: {what} (ExtenderArgs.Pod is the v1 Pod to place)")
    _check_quantities(raw_pod)
    found: list[ShapeWarning] = []
    try:
        pod, _ = pod_from_json(raw_pod, "Pod", found)
    except ConversionError as exc:
        raise BadRequest(f"Pod: {exc}") from None
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        # a field of the wrong JSON type that the converter did not name
        raise BadRequest(
            f"Pod: not a v1 Pod defrag can read ({type(exc).__name__}: {exc})"
        ) from None
    _check_requests(pod)
    unmodelled = "; ".join(str(w) for w in found if w.leave_out)
    if unmodelled:
        log.warning("not judging %s: %s", pod.key, unmodelled)
    names = args.get("NodeNames")
    nodes = args.get("Nodes")
    if names is not None:
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise BadRequest("NodeNames: expected a list of node names (strings) or null")
        return ExtenderArgs(pod, tuple(names), None, unmodelled)
    if nodes is None:
        raise BadRequest("Nodes and NodeNames: both null or missing; one must list the nodes")
    if not isinstance(nodes, dict):
        raise BadRequest("Nodes: expected a v1 NodeList object ({metadata, items}) or null")
    node_list = go_fields(nodes, NODE_LIST_FIELDS)
    items = node_list.get("items")
    if items is None:  # Go marshals an empty NodeList's nil Items as null
        items = []
    if not isinstance(items, list):
        raise BadRequest("Nodes.items: expected a list of v1 Node objects or null")
    node_names = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest(f"Nodes.items[{i}].metadata.name: missing")
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        if annotations is not None and not isinstance(annotations, dict):
            raise BadRequest(f"Nodes.items[{i}].metadata.annotations: expected an object")
        node_names.append(name)
    return ExtenderArgs(pod, tuple(node_names), tuple(items), unmodelled)


def _check_quantities(raw_pod: Mapping[str, Any]) -> None:
    """Kubernetes validation refuses a negative quantity in any container's requests or limits
    ("must be greater than or equal to 0"); a pod asking −1 GPU was never admitted."""
    spec = raw_pod.get("spec")
    if not isinstance(spec, dict):
        return
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            resources = container.get("resources") if isinstance(container, dict) else None
            if resources is None:
                continue
            if not isinstance(resources, dict):
                raise BadRequest(f"Pod.spec.{kind}[{i}].resources: expected an object")
            for part in ("requests", "limits"):
                values = resources.get(part)
                if not isinstance(values, dict):
                    continue
                for name, value in values.items():
                    if str(value).strip().startswith("-"):
                        raise BadRequest(
                            f"Pod.spec.{kind}[{i}].resources.{part}[{name}]: negative quantity "
                            f"{value!s} (must be greater than or equal to 0)"
                        )


def _check_requests(pod: Pod) -> None:
    """A request Kubernetes would refuse (negative GPUs or shares) is a body it never sent."""
    if pod.num_gpu < 0:
        raise BadRequest(f"Pod: spec.containers[].resources: negative GPU request ({pod.num_gpu})")
    for name in ("gpu_milli", "cpu_milli", "memory_mib"):
        value = getattr(pod, name, 0)
        if isinstance(value, int | float) and (value < 0 or value != value):
            raise BadRequest(f"Pod: spec.containers[].resources: {name} {value} is not a quantity")


def extender_scores(scores: FloatArray, winner: BoolArray) -> IntArray:
    """Policy scores (0..100) on kube-scheduler's extender scale (0..10); see the module doc.

    The winner gets 10; any other node ``min(9, floor(score / 10))``; NaN (not feasible) → 0.
    The floor is ``//``'s, at half its cost: ``floor(score / 10)``, less one wherever the
    rounded quotient reached a whole number the score is below (``10 × q`` then exceeds it).
    """
    top = 10.0 * (MAX_EXTENDER_PRIORITY - 1)
    clipped = np.where(np.isfinite(scores), scores, 0.0)
    np.clip(clipped, 0.0, top, out=clipped)
    tenths = np.floor(clipped / 10.0)
    tenths -= tenths * 10.0 > clipped
    values = tenths.astype(np.int64)
    values[winner] = MAX_EXTENDER_PRIORITY
    return values


def extender_score(score: float, winner: bool) -> int:
    """:func:`extender_scores` for one node."""
    return int(extender_scores(np.array([score]), np.array([winner]))[0])


VERBS = ("filter", "prioritize")


_PLAIN_NAMES = re.compile(r"[a-z0-9.,\-]*")


def encode_priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """A HostPriorityList (``[{"Host", "Score"}]``) as JSON, fast: node names (RFC 1123:
    lower-case letters, digits, '-' and '.') need no escaping, so 1,000 entries are joined
    directly; anything else goes through :func:`~defrag.adapters.jsonio.dumps`."""
    if _PLAIN_NAMES.fullmatch(",".join(hosts)):
        body = ",".join(
            f'{{"Host":"{h}","Score":{int(v)}}}' for h, v in zip(hosts, scores, strict=True)
        )
        return f"[{body}]".encode()
    items = [{"Host": h, "Score": int(v)} for h, v in zip(hosts, scores, strict=True)]
    return jsonio.dumps(items)


ObjectArray = np.ndarray[Any, np.dtype[np.object_]]
_SCORE_ENDS: ObjectArray = np.array(
    [f"{v}}},".encode() for v in range(MAX_EXTENDER_PRIORITY + 1)], dtype=object
)
"""``N},`` for each extender score N: a HostPriorityList entry's end."""


def host_prefixes(names: Sequence[str]) -> ObjectArray | None:
    """Each node's ``{"Host":"NAME","Score":`` as bytes, for :func:`encode_priorities_at`;
    None when a name would need JSON escaping (then :func:`encode_priorities` answers)."""
    if not _PLAIN_NAMES.fullmatch(",".join(names)):
        return None
    return np.array([f'{{"Host":"{n}","Score":'.encode() for n in names], dtype=object)


def encode_priorities_at(
    prefixes: ObjectArray, rows: IntArray, hosts: Sequence[str], scores: IntArray
) -> bytes:
    """:func:`encode_priorities`, byte for byte, from the hosts' precomputed prefixes (``rows``
    index ``prefixes``; -1: a host without one) and 0..10 scores, in one vectorised step."""
    missing = rows < 0
    parts = prefixes[np.where(missing, 0, rows)] if len(prefixes) else np.empty(len(rows), object)
    if missing.any():
        odd = [hosts[i] for i in np.flatnonzero(missing).tolist()]
        own = host_prefixes(odd)
        if own is None:
            return encode_priorities(hosts, scores.tolist())
        parts[missing] = own
    seq: list[bytes] = [b""] * (2 * len(rows))
    seq[0::2] = parts.tolist()
    seq[1::2] = _SCORE_ENDS[scores].tolist()
    body = b"".join(seq)
    return b"[" + body[:-1] + b"]"
