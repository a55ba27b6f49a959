"""The kube-scheduler extender: ``filter`` and ``prioritize`` with defrag's own score function.

The wire format is kube-scheduler's own (``k8s.io/kube-scheduler`` ``extender/v1/types.go``):
those structs carry no json tags, so ``json.Marshal`` in kube-scheduler (``pkg/scheduler/
extender.go``, ``HTTPExtender.send``) writes the Go field names. It POSTs an ``ExtenderArgs`` —
``{"Pod": <v1 Pod>, "Nodes": null, "NodeNames": [...]}`` when the extender is configured
``nodeCacheCapable``, else ``{"Pod": …, "Nodes": {"metadata": {}, "items": [<v1 Node>…]},
"NodeNames": null}`` — to ``<urlPrefix>/filter`` and ``<urlPrefix>/prioritize``. Keys are read
with ``encoding/json``'s rules (an exact match, else a case-insensitive one: :func:`go_fields`), so
the lowercase form decodes too. The answers use the same field names: an
``ExtenderFilterResult`` ``{"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
"Error"}`` (the list in the request's mode, the other null) and a ``HostPriorityList``
``[{"Host", "Score"}]``, scores 0..10. kube-scheduler reads no body from a non-200 answer; a
body it could not have sent gets 400 with ``{"Error": <the field that is wrong>}``.

Score mapping (0..100 → 0..10): the node :func:`schedule` picks gets 10; every other feasible
node gets ``min(9, floor(score / 10))``; infeasible and unknown nodes get 0. Plain rounding
would tie the winner with near-winners (95 and 100 both → 10) and let kube-scheduler's random
tie-break undo the packing; reserving 10 for the winner keeps defrag's choice on top.

Reservations: a node annotated ``defrag.io/reserved-for: <namespace>/<pod>`` (set by make-room
plans) or ``owner:<namespace>/<Kind>/<name>`` (a migration's target, kept for the replacement:
any pod of that controlling owner; holders comma-separated) is filtered out for every other pod,
in ``FailedAndUnresolvableNodes`` so kube-scheduler does not preempt its way onto the room made
for someone else.

Hardening (any client that reaches the port is served by the same process as kube-scheduler):
a body is at most :data:`MAX_BODY_BYTES` (sized from a 5,000-node ``Nodes``-mode request, see
docs/operations.md) and waits for room in a budget of body bytes held at once
(:class:`BodyBudget`) before it is read, so concurrent huge bodies queue instead of multiplying
memory; connections are a bounded pool with idle and read deadlines
(:class:`~defrag.adapters.httpserve.BoundedHTTPServer`); every body kube-scheduler could not
have sent gets 400 naming the field, never 500; TLS is an option (``enableHTTPS``).
"""

from __future__ import annotations
