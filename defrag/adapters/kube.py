"""The live cluster through the ``kubernetes`` client: snapshot, actuator and leader election.

- :class:`KubeClusterSource` lists nodes, pods, PodDisruptionBudgets and PriorityClasses page by
  page and converts the raw JSON with :mod:`defrag.adapters.kube_convert` (the client's own
  deserialisation into model objects is skipped: ``_preload_content=False``, then
  :func:`defrag.adapters.jsonio.loads`).
- :class:`KubeActuator` implements :class:`defrag.ports.Actuator`: policy/v1 Evictions, node
  taints and annotations by patch, core/v1 Events.
- :class:`LeaseElector` elects a leader on a ``coordination.k8s.io/v1`` Lease.

Transient failures (5xx, API-priority 429s, timeouts, dropped connections) are retried with
exponential backoff (tenacity); everything else becomes a :class:`KubeError` naming the call.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from prometheus_client import Counter, Histogram
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)
from tenacity.stop import stop_base

from defrag.adapters import jsonio
from defrag.adapters.deadline import (
    Deadline,
    budget_spent,
    request_deadline,
    watch_pool_manager,
)
from defrag.adapters.kube_convert import ClusterParts, ConversionError, paused_gc
from defrag.execute.fence import Tenure
from defrag.model.cluster import Cluster, ModelError
from defrag.model.status import Status
from defrag.model.utc import utc
from defrag.ports import Clock, EvictionResult, SpendUnreadable
from defrag.redact import redact_url

log = logging.getLogger(__name__)

T = TypeVar("T")
COMPONENT = "defrag"
CLUSTER_EVENT_NAMESPACE = "default"
"""Where Events about cluster-scoped objects go: the only namespace the API server accepts for
an Event (without ``eventTime``) whose ``involvedObject`` has no namespace."""
CLUSTER_SCOPED_KINDS = frozenset({"Node"})
"""The cluster-scoped kinds defrag writes Events about."""
WINDOW_SPEND_ANNOTATION = "defrag.io/window-spend"
"""On the leader's Lease: the eviction budget spent in the current window (JSON)."""


API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
"""What a call to the API server raises when it fails (refused, cut off, timed out): the Lease's
reads and writes turn each into a follower or a refusal, never a crash."""


class KubeError(RuntimeError):
    """A Kubernetes API call that failed for good (after retries), with what was asked."""


# --- connection --------------------------------------------------------------------------------


def connect(
    kubeconfig: str | None = None, context: str | None = None, in_cluster: bool | None = None
) -> client.ApiClient:
    """An API client from ``kubeconfig``, else ``$KUBECONFIG`` (a colon-separated list, as the
    client and kubectl read it), else in a pod the service account, else ``~/.kube/config``."""
    if kubeconfig is None:
        kubeconfig = os.environ.get("KUBECONFIG") or None
    if in_cluster is None:
        in_cluster = kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
    configuration = client.Configuration()
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
    except (ConfigException, OSError) as exc:
        where = "in-cluster service account" if in_cluster else (kubeconfig or "kubeconfig")
        raise KubeError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
    # No retries inside urllib3 (3 a request, each logged as a warning): defrag's RetryPolicy
    # retries, with backoff and within the deadline, and reports once.
    configuration.retries = False
    api = client.ApiClient(configuration)
    # Every request's socket can be shut by its deadline (_Caller): the client's own timeout
    # bounds each socket read, so an API server that trickles its answer never trips it.
    watch_pool_manager(api.rest_client.pool_manager)
    return api


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of transient failures: ``attempts`` in all, backoff doubling from ``backoff_s``."""

    attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    timeout_s: float = 30.0
    """Per-request wall-clock limit: connecting, the whole answer however slowly it comes
    (a deadline shuts the socket, :mod:`defrag.adapters.deadline`), each attempt alone."""


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def api_message(exc: ApiException) -> str:
    """The API server's own message (and causes) from a Status body, else the HTTP reason."""
    body = _status_body(exc)
    message = str(body.get("message") or exc.reason or "")
    causes = [str(c.get("message")) for c in (body.get("details") or {}).get("causes") or [] if c]
    return "; ".join([message, *causes]) if causes else message


def _is_pdb_refusal(exc: ApiException) -> bool:
    if exc.status != 429:
        return False
    body = _status_body(exc)
    causes = (body.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "DisruptionBudget" for c in causes) or (
        "disruption budget" in str(body.get("message", "")).lower()
    )


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        status = exc.status or 0
        return status >= 500 or (status == 429 and not _is_pdb_refusal(exc)) or status == 0
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def plural(kind: str) -> str:
    """``PriorityClass`` → ``PriorityClasses``, ``Node`` → ``Nodes``: the kinds in messages."""
    return f"{kind}es" if kind.endswith("s") else f"{kind}s"


API_RETRIES = Counter(
    "defrag_kube_api_transient_errors",
    "Kubernetes API requests that failed transiently (retried, or given up on after the "
    "retries), by reason: 5xx, 429 (throttling, not a PDB), connection (reset, refused, an "
    "answer cut off), timeout.",
    ["reason"],
)
API_SECONDS = Histogram(
    "defrag_kube_api_call_seconds",
    "Wall time of one Kubernetes API call, retries included.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
for _reason in ("5xx", "429", "connection", "timeout"):
    API_RETRIES.labels(reason=_reason)


def _retry_reason(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        if exc.status == 429:
            return "429"
        return "5xx" if (exc.status or 0) >= 500 else "connection"
    if isinstance(exc, TimeoutError | urllib3.exceptions.TimeoutError):
        return "timeout"
    return "connection"


def _loaded(response: Any) -> Any:
    """The answer with its body read, inside the retried call: a body cut off is a transient
    failure of that call (retried, counted), not an error after it."""
    _ = response.data
    return response


def _whole(response: Any) -> Any:
    """Read the whole answer of a write whose body defrag does not use: one cut off after its
    status line is counted and logged (the status says the request was carried out)."""
    try:
        _ = response.data
    except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
        API_RETRIES.labels(reason="connection").inc()
        log.info(
            "Kubernetes API answer (HTTP %s) cut off: %s; the request was carried out",
            getattr(response, "status", "?"),
            _describe(exc),
        )
    return response


def count_transient(exc: BaseException) -> str:
    """Count ``exc`` on ``defrag_kube_api_transient_errors_total`` when it is transient (a
    retried call's failure, or a watch request's); its reason, or "" when it is not."""
    if not _transient(exc):
        return ""
    reason = _retry_reason(exc)
    API_RETRIES.labels(reason=reason).inc()
    return reason


def _count_failure(exc: BaseException) -> None:
    """A transient failure: counted, and one INFO line naming it (retried with backoff)."""
    _log_retry(count_transient(exc), exc)


def _log_retry(reason: str, exc: BaseException) -> None:
    log.info("Kubernetes API call failed (%s, %s); retrying with backoff", reason, _describe(exc))


class DeadlineExceeded(TimeoutError):
    """An API request did not finish by its deadline (its own, or the command's or cycle's)."""


class _Caller:
    """Runs one API call with the retry policy; the last error is re-raised.

    Each attempt runs under :func:`~defrag.adapters.deadline.request_deadline` of
    ``policy.timeout_s`` (or what is left of the thread's command or cycle budget): past it the
    socket is shut and the attempt fails with :class:`DeadlineExceeded`, retried like any
    timeout while the budget lasts. This only holds for clients made by :func:`connect`, whose
    pools are watched. Each transient failure is counted on
    ``defrag_kube_api_transient_errors_total`` and logged at INFO."""

    def __init__(self, policy: RetryPolicy, api: client.ApiClient | None = None) -> None:
        self.policy = policy
        host = getattr(getattr(api, "configuration", None), "host", None)
        self.server = f"the API server at {redact_url(str(host))}" if host else "the API server"

    def __call__(self, fn: Callable[[], T]) -> T:
        p = self.policy

        def counted() -> T:
            try:
                return self.attempt(fn)
            except BaseException as exc:
                if _transient(exc):
                    _count_failure(exc)  # after the deadline has named it
                raise

        retrying = Retrying(
            stop=stop_after_attempt(max(1, p.attempts)) | _BudgetSpent(),
            wait=wait_exponential(multiplier=p.backoff_s, max=p.max_backoff_s),
            retry=retry_if_exception(_transient),
            reraise=True,
        )
        started = time.monotonic()
        try:
            return retrying(counted)
        finally:
            API_SECONDS.observe(time.monotonic() - started)

    def attempt(self, fn: Callable[[], T]) -> T:
        """One attempt of ``fn`` under the request deadline."""
        with request_deadline(self.policy.timeout_s) as deadline:
            try:
                return fn()
            except Exception:
                if deadline.expired:
                    raise self.late(deadline) from None
                raise

    def late(self, deadline: Deadline) -> DeadlineExceeded:
        if deadline.by_budget:
            return DeadlineExceeded(f"{self.server} did not answer before {deadline.why}")
        return DeadlineExceeded(
            f"{self.server} did not answer within {deadline.seconds:g} s (the whole request)"
        )

    @property
    def timeout(self) -> tuple[float, float]:
        """urllib3's (connect, read) timeouts: a backstop only. The read timeout is twice the
        request deadline, so the deadline (which bounds the whole request) always ends a slow
        answer first and says so, even on a loaded machine."""
        return (self.policy.timeout_s, 2 * self.policy.timeout_s)


class _BudgetSpent(stop_base):
    """tenacity stop: the command's or cycle's budget is spent, another attempt cannot end."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        return budget_spent()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status}: {api_message(exc)}"
    if isinstance(exc, DeadlineExceeded):
        return str(exc)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        # "<pool>(host=…, port=…): Failed to establish a new connection: [Errno 111] …"
        return str(exc).split("): ", 1)[-1]
    return f"{type(exc).__name__}: {exc}"


# --- snapshot -----------------------------------------------------------------------------------


class KubeClusterSource:
    """:class:`defrag.ports.ClusterSource` over the API: one consistent-enough list per kind."""

    def __init__(
        self,
        api: client.ApiClient,
        page_size: int = 500,
        retry: RetryPolicy | None = None,
        skip_finished_pods: bool = True,
    ) -> None:
        self.api = api
        self.page_size = page_size
        self.call = _Caller(retry or RetryPolicy(), api)
        self.skip_finished_pods = skip_finished_pods
        self._said: set[str] = set()
        # The client's typed models are bypassed (raw JSON both ways), hence Any.
        self.core: Any = client.CoreV1Api(api)
        self.policy: Any = client.PolicyV1Api(api)
        self.scheduling: Any = client.SchedulingV1Api(api)

    def listings(self) -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
        """(kind, list call, its arguments) for each kind a snapshot reads, in order."""
        pods = (
            {"field_selector": "status.phase!=Succeeded,status.phase!=Failed"}
            if self.skip_finished_pods
            else {}
        )
        return [
            ("PriorityClass", self.scheduling.list_priority_class, {}),
            ("Node", self.core.list_node, {}),
            ("Pod", self.core.list_pod_for_all_namespaces, pods),
            ("PodDisruptionBudget", self.policy.list_pod_disruption_budget_for_all_namespaces, {}),
        ]

    def snapshot(self) -> Cluster:
        parts = ClusterParts()
        with paused_gc():
            for kind, lister, kwargs in self.listings():
                parts.extend(self._collect(kind, lister, kwargs))
            try:
                cluster = parts.build(lenient=True)
            except ModelError as exc:
                raise KubeError(f"inconsistent cluster snapshot: {exc}") from exc
        if parts.dropped:
            log.warning(
                "left out %d pod(s) bound to nodes that were not listed (the node list and the "
                "pod list are not one atomic read): %s",
                len(parts.dropped),
                ", ".join(parts.dropped[:5]),
            )
        new = [w for w in cluster.warnings if w not in self._said]
        for warning in new:
            log.warning("not modelled fully: %s", warning)
        self._said = set(cluster.warnings)  # said once while it lasts, again if it comes back
        return cluster

    def _collect(
        self, kind: str, lister: Callable[..., Any], kwargs: dict[str, Any], convert: bool = True
    ) -> ClusterParts:
        """Every object of ``kind``, page by page, each page converted as it arrives (so the raw
        JSON of one page at a time is held). An expired continue token (410) starts again."""
        for _restart in range(3):
            parts = ClusterParts()
            token: str | None = None
            index = 0
            try:
                while True:
                    page = self._page(lister, kwargs, token)
                    items = page.get("items") or []
                    if convert:
                        for item in items:
                            try:
                                parts.add(item, f"{kind} list item {index}", kind=kind)
                            except ConversionError as exc:
                                raise KubeError(
                                    f"the API returned a {kind} defrag cannot read: {exc}"
                                ) from exc
                            index += 1
                    token = (page.get("metadata") or {}).get("continue") or None
                    if not token:
                        return parts
            except ApiException as exc:
                if exc.status == 410:
                    log.info("listing %s: continue token expired, listing again", plural(kind))
                    continue
                raise KubeError(f"cannot list {plural(kind)}: {_describe(exc)}") from None
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
                raise KubeError(f"cannot list {plural(kind)}: {_describe(exc)}") from None
        raise KubeError(f"cannot list {plural(kind)}: the continue token kept expiring")

    def _page(
        self, lister: Callable[..., Any], kwargs: dict[str, Any], token: str | None
    ) -> dict[str, Any]:
        def call() -> dict[str, Any]:
            args = dict(kwargs, limit=self.page_size)
            if token:
                args["_continue"] = token
            response = lister(**args, _preload_content=False, _request_timeout=self.call.timeout)
            data = jsonio.loads(response.data)
            if not isinstance(data, dict):
                raise KubeError("the API returned a list that is not a JSON object")
            return data

        return self.call(call)


class KubeUnscheduledPods(KubeClusterSource):
    """A :class:`~defrag.ports.ClusterSource` of the pods bound to no node and not finished, and
    nothing else (a field selector the API server answers from its index): what the executor
    reads to confirm that a drain's replacements are all scheduled, without listing the
    cluster (``Executor.confirm``)."""

    def listings(self) -> list[tuple[str, Callable[..., Any], dict[str, Any]]]:
        unbound = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
        return [("Pod", self.core.list_pod_for_all_namespaces, {"field_selector": unbound})]


# --- actuator -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Intent:
    """A write a client-side dry run did not send."""

    action: str
    target: str
    detail: str = ""


class KubeActuator:
    """:class:`defrag.ports.Actuator` over the API.

    ``send_writes=False`` (client-side dry run) sends no write request at all: each intended
    write is logged and kept in :attr:`intents`. :meth:`rehearse_eviction` instead asks the API
    server for a server-side dry run of the Eviction (``dryRun=All``): the PDB is checked,
    nothing happens.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        send_writes: bool = True,
        retry: RetryPolicy | None = None,
        conflict_attempts: int = 5,
        instance: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.api = api
        self.send_writes = send_writes
        self.call = _Caller(retry or RetryPolicy(), api)
        self.conflict_attempts = conflict_attempts
        self.instance = instance or socket.gethostname()
        self.clock = clock
        self.core: Any = client.CoreV1Api(api)  # raw JSON bodies and responses
        self.intents: list[Intent] = []
        self.fence: Callable[[], bool] | None = None
        """Asked before an eviction is tried again: False (the Lease is lost) stops it."""
        self.send_guard: Callable[[], bool] | None = None
        """Asked (no request: a clock check) right before each Eviction is sent: False stops
        it. The executor's fence reads the Lease before the step; a process paused between that
        read and the send would otherwise evict after another replica took over."""

    def _now(self) -> datetime:
        return self.clock.now() if self.clock is not None else datetime.now(UTC)

    def _intend(self, action: str, target: str, detail: str = "") -> None:
        self.intents.append(Intent(action, target, detail))
        log.info("dry run: would %s %s %s", action, target, detail)

    # --- evictions ---------------------------------------------------------------------------

    def evict(self, namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        """A policy/v1 Eviction of ``namespace/name``.

        ``uid``: the pod's UID when it was planned, sent as ``deleteOptions.preconditions.uid``
        (policy/v1 ``Eviction.DeleteOptions``, meta/v1 ``Preconditions.UID``): if the name now
        belongs to a replacement (a StatefulSet recreates the same name), the API server answers
        409 Conflict instead of evicting it — also when a retry follows a lost response.
        A 429 with a ``DisruptionBudget`` cause is a PDB refusal (blocked); any other 429 is
        API throttling (priority and fairness), retried with backoff, then failed.
        """
        return self._eviction(namespace, name, uid, rehearsal=False)

    def rehearse_eviction(self, namespace: str, name: str, *, uid: str = "") -> EvictionResult:
        """The same Eviction as a server-side dry run: ``dryRun=All`` on the create (policy/v1
        Eviction; the API server copies it into the Eviction's DeleteOptions).

        Upstream, kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go (commit
        01aa0f3f): ``propagateDryRun`` carries the request's ``CreateOptions.DryRun`` into the
        Eviction's ``DeleteOptions``; ``checkAndDecrement`` refuses with the same 429 and
        ``DisruptionBudget`` cause when ``disruptionsAllowed`` is 0 and returns before it writes
        the PDB's status when it is a dry run; the pod's delete is a dry run too. So the answer
        is the real one, and nothing changes: no pod deleted, no budget spent."""
        return self._eviction(namespace, name, uid, rehearsal=True)

    def _eviction(self, namespace: str, name: str, uid: str, *, rehearsal: bool) -> EvictionResult:
        key = f"{namespace}/{name}"
        if not self.send_writes:
            if not rehearsal:  # a rehearsal intends no write
                self._intend("evict", key)
            return EvictionResult(key, "evicted", "dry run: not sent")
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        # the client's name for the ``dryRun`` query parameter
        extra: dict[str, Any] = {"dry_run": "All"} if rehearsal else {}

        def post() -> None:
            response = self.core.create_namespaced_pod_eviction(
                name,
                namespace,
                body,
                _preload_content=False,
                _request_timeout=self.call.timeout,
                **extra,
            )
            _whole(response)  # a 201 cut off mid-body was carried out all the same

        attempts = max(1, self.call.policy.attempts)
        for attempt in range(attempts):
            if not rehearsal and self.send_guard is not None and not self.send_guard():
                return EvictionResult(
                    key,
                    "not-leader",
                    "not sent: this replica's hold on the Lease has lapsed by its own clock "
                    "(the process was paused or starved since the Lease was checked)",
                )
            try:
                self.call.attempt(post)  # under the whole-request deadline
                break
            except ApiException as exc:
                if exc.status == 429 and _is_pdb_refusal(exc):
                    return EvictionResult(key, "blocked", api_message(exc))
                if exc.status == 404:
                    return EvictionResult(key, "gone", "the pod no longer exists")
                if exc.status == 409 and uid:
                    return EvictionResult(
                        key,
                        "gone",
                        f"the pod with UID {uid} no longer exists; {key} is a replacement, not "
                        f"evicted ({api_message(exc)})",
                    )
                if not _transient(exc):
                    return EvictionResult(key, "failed", _describe(exc))
                last: BaseException = exc
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
                last = exc
            reason = count_transient(last)  # every try's, the last one's too
            if attempt + 1 == attempts:
                if isinstance(last, ApiException) and last.status == 429:
                    return EvictionResult(
                        key,
                        "failed",
                        f"API server throttling (429 without a DisruptionBudget cause) after "
                        f"{attempts} tries with backoff: {api_message(last)}",
                    )
                return EvictionResult(key, "failed", _describe(last))
            _log_retry(reason, last)
            # Before trying again: the request may have been carried out although its answer
            # was lost (a connection reset, a gateway's 5xx). A second eviction of a pod
            # already Terminating is answered 201 again, and skips the PDB check: look first.
            time.sleep(min(self.call.policy.backoff_s * 2**attempt, self.call.policy.max_backoff_s))
            if rehearsal:  # changed nothing: asking again is safe
                continue
            outcome, why = self._eviction_outcome(namespace, name, uid)
            if outcome != "retry":
                return EvictionResult(key, outcome, f"{why} (after {_describe(last)})")
            if self.fence is not None and not self.fence():
                return EvictionResult(
                    key, "not-leader", f"not retried: the Lease was lost ({_describe(last)})"
                )
        return EvictionResult(key, "evicted", "server dry run" if rehearsal else "")

    def _eviction_outcome(self, namespace: str, name: str, uid: str) -> tuple[str, str]:
        """What became of a pod whose eviction answer was lost: ``("evicted", why)`` when it
        (with ``uid``) is Terminating, ``("gone", why)`` when it no longer exists (or the name
        is a replacement's), ``("retry", why)`` when it is still there and running; when it
        cannot be told, ``("failed", why)``: a second eviction of a pod already Terminating
        would be answered 201 again, so it is never sent on a guess.

        Read with ``list`` and a field selector: defrag's role may list pods, not get them."""
        try:
            response = self.call(
                lambda: _loaded(
                    self.core.list_namespaced_pod(
                        namespace,
                        field_selector=f"metadata.name={name}",
                        _preload_content=False,
                        _request_timeout=self.call.timeout,
                    )
                )
            )
            items = json.loads(response.data).get("items") or []
        except API_ERRORS as exc:
            return "failed", f"its answer was lost and the pod cannot be read ({_describe(exc)})"
        except (ValueError, AttributeError) as exc:
            return "failed", f"its answer was lost and the pod cannot be read ({exc})"
        if not items:
            return "gone", "the pod no longer exists"
        meta = items[0].get("metadata") or {}
        if uid and meta.get("uid") not in (None, "", uid):
            return "gone", f"the pod with UID {uid} no longer exists; {name} is a replacement"
        if meta.get("deletionTimestamp"):
            return "evicted", "the pod is Terminating: the earlier try was carried out"
        return "retry", ""

    # --- nodes -------------------------------------------------------------------------------

    def taint_node(self, node: str, key: str, value: str, effect: str) -> None:
        def change(taints: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            wanted = {"key": key, "value": value, "effect": effect}
            same = [t for t in taints if t.get("key") == key and t.get("effect") == effect]
            if same and all(t.get("value", "") == value for t in same):
                return None
            kept = [t for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
            return [*kept, wanted]

        self._update_taints(node, f"taint {key}={value}:{effect}", change)

    def untaint_node(self, node: str, key: str) -> None:
        def change(taints: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
            kept = [t for t in taints if t.get("key") != key]
            return kept if len(kept) != len(taints) else None

        self._update_taints(node, f"untaint {key}", change)

    def _update_taints(
        self,
        node: str,
        what: str,
        change: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None],
    ) -> None:
        """Read the node, change its taint list, patch it with the read resourceVersion as a
        precondition (``spec.taints`` is replaced whole, so a concurrent change → 409 → again)."""
        if not self.send_writes:
            self._intend(what, f"node/{node}")
            return
        for _attempt in range(self.conflict_attempts):
            current = self._get_node(node)
            taints = list((current.get("spec") or {}).get("taints") or [])
            new = change(taints)
            if new is None:
                return  # already as wanted: no write
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": {"taints": new},
            }
            try:
                self._patch_node(node, patch)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise KubeError(f"cannot {what} on node {node}: {_describe(exc)}") from None
                log.info("node %s changed while we patched it; reading it again", node)
        raise KubeError(f"cannot {what} on node {node}: it kept changing (409 conflicts)")

    def annotate_node(self, node: str, annotations: Mapping[str, str | None]) -> None:
        """Set annotations; a value of None removes that annotation."""
        if not annotations:
            return
        if not self.send_writes:
            self._intend("annotate", f"node/{node}", json.dumps(dict(annotations)))
            return
        try:
            self._patch_node(node, {"metadata": {"annotations": dict(annotations)}})
        except ApiException as exc:
            raise KubeError(f"cannot annotate node {node}: {_describe(exc)}") from None

    def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set annotations on a pod (None removes one): a strategic-merge patch of
        ``metadata.annotations`` (core/v1 ``PATCH /api/v1/namespaces/{ns}/pods/{name}``, verb
        ``patch`` on ``pods``); without a ``resourceVersion`` it never conflicts."""
        if not annotations:
            return
        key = f"{namespace}/{name}"
        if not self.send_writes:
            self._intend("annotate", f"pod/{key}", json.dumps(dict(annotations)))
            return
        patch = {"metadata": {"annotations": dict(annotations)}}
        try:
            self.call(
                lambda: _whole(
                    self.core.patch_namespaced_pod(
                        name,
                        namespace,
                        patch,
                        _content_type="application/strategic-merge-patch+json",
                        _preload_content=False,
                        _request_timeout=self.call.timeout,
                    )
                )
            )
        except ApiException as exc:
            raise KubeError(f"cannot annotate pod {key}: {_describe(exc)}") from None
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            raise KubeError(f"cannot annotate pod {key}: {_describe(exc)}") from None

    def _get_node(self, node: str) -> dict[str, Any]:
        try:
            response = self.call(
                lambda: _loaded(
                    self.core.read_node(
                        node, _preload_content=False, _request_timeout=self.call.timeout
                    )
                )
            )
        except ApiException as exc:
            raise KubeError(f"cannot read node {node}: {_describe(exc)}") from None
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            raise KubeError(f"cannot read node {node}: {_describe(exc)}") from None
        data: dict[str, Any] = json.loads(response.data)
        return data

    def _patch_node(self, node: str, patch: dict[str, Any]) -> None:
        try:
            self.call(
                lambda: _whole(
                    self.core.patch_node(
                        node,
                        patch,
                        _content_type="application/strategic-merge-patch+json",
                        _preload_content=False,
                        _request_timeout=self.call.timeout,
                    )
                )
            )
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            raise KubeError(f"cannot patch node {node}: {_describe(exc)}") from None

    # --- events ------------------------------------------------------------------------------

    def event(
        self, kind: str, namespace: str, name: str, reason: str, message: str, warning: bool = False
    ) -> None:
        """A core/v1 Event about a pod, in the pod's namespace, or about a cluster-scoped object
        (a node: ``namespace`` empty), in ``default``.

        The API server refuses any other namespace (422 ``involvedObject.namespace: Invalid
        value: "": does not match event.namespace``; core/v1 Event validation: an Event without
        ``eventTime`` about a cluster-scoped object must be in ``default``, one about a
        namespaced object in that object's namespace). Best effort: a failure is logged, never
        raised."""
        involved: dict[str, Any] = {"kind": kind, "name": name, "apiVersion": "v1"}
        cluster_scoped = kind in CLUSTER_SCOPED_KINDS or not namespace
        if not cluster_scoped:
            involved["namespace"] = namespace
        where = CLUSTER_EVENT_NAMESPACE if cluster_scoped else namespace
        now = utc(self._now())
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": where},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.instance},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "action": reason,
        }
        if not self.send_writes:
            self._intend("event", f"{kind.lower()}/{where}/{name}", f"{reason}: {message}")
            return
        try:
            self.call(
                lambda: _whole(
                    self.core.create_namespaced_event(
                        where, body, _preload_content=False, _request_timeout=self.call.timeout
                    )
                )
            )
        except API_ERRORS as exc:
            log.warning("cannot record event %s on %s %s: %s", reason, kind, name, _describe(exc))


# --- leader election ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    leader: bool
    holder: str
    reason: str
    conflict: bool = False
    """The write was answered 409 (our read was stale)."""


def _micro(t: datetime) -> str:
    return utc(t).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return utc(parsed)


class LeaseElector:
    """Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

    Call :meth:`is_leader` (or :meth:`tick`) at least every ``lease_duration_s / 2``: it creates
    the Lease, renews our hold, or takes over one whose holder let it expire. Every write carries
    the resourceVersion read, so of two candidates racing only one wins (the other gets 409).
    Expiry is judged on ``renewTime + leaseDurationSeconds`` against this process's clock.
    :meth:`release` (also on leaving a ``with`` block) hands the Lease back at once.

    One process, one owner: the daemon's cycle and its renewal job call in from different
    threads, and two of our own writes racing on one resourceVersion would make us lose the
    Lease to ourselves (409). So every read-then-write here runs under one lock, and a 409 is
    re-read before the hold is given up: a Lease that still names us with our generation was
    changed by someone else (or our own write landed before its retry), and we renew on it.

    It is also the :class:`~defrag.ports.SpendRecord` of the window's eviction budget: the
    spend rides on the Lease as :data:`WINDOW_SPEND_ANNOTATION`, written only by the holder,
    with the resourceVersion read (so a deposed leader's write is refused).
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str = "defrag-leader",
        identity: str | None = None,
        lease_duration_s: float = 15,
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or f"{socket.gethostname()}_{os.getpid()}"
        self.lease_duration_s = max(1, math.ceil(lease_duration_s))  # the API takes whole seconds
        self.clock = clock
        self.call = _Caller(retry or RetryPolicy(attempts=2, backoff_s=0.2), api)
        self.coordination: Any = client.CoordinationV1Api(api)  # raw JSON both ways
        self.last = LeaderStatus(False, "", "not tried yet")
        self._generation = -1
        """``leaseTransitions`` of our current holding; -1 while we hold none."""
        self._renewed_at: float | None = None
        """``time.monotonic()`` of our last successful create/renew/takeover."""
        self._lock = threading.RLock()
        """Held across every read-then-write of the Lease (and the reads the fence makes)."""

    def _now(self) -> datetime:
        return self.clock.now() if self.clock is not None else datetime.now(UTC)

    def is_leader(self) -> bool:
        return self.tick().leader

    def tick(self) -> LeaderStatus:
        """Acquire, renew or observe the Lease. API failures make us a follower (never raise)."""
        with self._lock:
            try:
                self.last = self._tick()
                if self.last.conflict and self._holder(self._read()) == self.identity:
                    # The Lease changed between our read and our write but still names us
                    # (another writer touched it, or our own write landed before a retry):
                    # renew on what is there now rather than give the hold up.
                    self.last = self._tick(again=False)
                if not self.last.leader:
                    self._renewed_at, self._generation = None, -1
            except API_ERRORS as exc:
                self.last = LeaderStatus(False, self.last.holder, f"lease: {_describe(exc)}")
                log.warning(
                    "leader election on %s/%s failed: %s",
                    self.namespace,
                    self.name,
                    self.last.reason,
                )
            return self.last

    def _tick(self, again: bool = True) -> LeaderStatus:
        now = self._now()
        lease = self._read()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, acquire=True, transitions=0),
            }
            return self._write(
                lambda: _whole(
                    self.coordination.create_namespaced_lease(
                        self.namespace,
                        body,
                        _preload_content=False,
                        _request_timeout=self.call.timeout,
                    )
                ),
                "created the Lease",
                LeaderStatus(False, "", "another candidate created the Lease first", again),
                0,
            )
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        transitions = int(spec.get("leaseTransitions") or 0)
        generation = transitions
        if holder == self.identity:
            spec_new = {
                **spec,
                "renewTime": _micro(now),
                "leaseDurationSeconds": self.lease_duration_s,
            }
            reason = "renewed the Lease"
        else:
            renewed = _parse_time(spec.get("renewTime")) or _parse_time(spec.get("acquireTime"))
            duration = int(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            if holder and renewed is not None and now < renewed + timedelta(seconds=duration):
                return LeaderStatus(False, holder, f"held by {holder}")
            spec_new = self._spec(now, acquire=True, transitions=transitions + 1)
            generation = transitions + 1
            reason = f"took over the Lease from {holder}" if holder else "acquired a free Lease"
        body = {**lease, "spec": spec_new}
        return self._write(
            self._replace(body),
            reason,
            LeaderStatus(False, holder, "lost a race for the Lease (409 conflict)", again),
            generation,
        )

    def _replace(self, body: dict[str, Any]) -> Callable[[], object]:
        """The request that replaces the Lease with ``body`` (for ``self.call``)."""
        return lambda: _whole(
            self.coordination.replace_namespaced_lease(
                self.name,
                self.namespace,
                body,
                _preload_content=False,
                _request_timeout=self.call.timeout,
            )
        )

    def _write(
        self,
        write: Callable[[], object],
        reason: str,
        on_conflict: LeaderStatus,
        generation: int,
    ) -> LeaderStatus:
        """Create or replace the Lease: leading on success, ``on_conflict`` on a 409."""
        started = time.monotonic()
        try:
            self.call(write)
        except ApiException as exc:
            if exc.status == 409:
                self._renewed_at, self._generation = None, -1
                return on_conflict
            raise
        # The hold counts from before the request went out (the server's renewTime is ours).
        self._renewed_at, self._generation = started, generation
        return LeaderStatus(True, self.identity, reason)

    # --- fencing (defrag.execute.fence.Fence) ----------------------------------------------

    def tenure(self) -> Tenure:
        return Tenure(self.identity, max(self._generation, 0))

    def still_leader(self) -> bool:
        """Whether we hold the Lease now: our last renewal is younger than the lease duration
        (by this process's monotonic clock; another candidate takes over only after it has
        expired) and the Lease, read now, still names us with our generation. Any doubt (a
        failed read) is a no: the executor stops rather than write without the Lease."""
        with self._lock:  # never between a renewal's read and its write
            if not self.holds_now():
                return False
            try:
                lease = self._read()
            except API_ERRORS as exc:
                log.warning("cannot confirm the Lease before a write: %s", _describe(exc))
                return False
            return self._names_us(lease)

    @staticmethod
    def _holder(lease: Mapping[str, Any] | None) -> str:
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def _names_us(self, lease: Mapping[str, Any] | None) -> bool:
        """Whether ``lease`` names us as its holder with our generation."""
        spec = (lease or {}).get("spec") or {}
        return (
            self._generation >= 0
            and str(spec.get("holderIdentity") or "") == self.identity
            and int(spec.get("leaseTransitions") or 0) == self._generation
        )

    def holds_now(self) -> bool:
        """Whether our last renewal is younger than the lease duration, by this process's
        monotonic clock (which runs on while the process is stopped): no request, so it can be
        asked right before a write."""
        with self._lock:
            renewed = self._renewed_at
            return renewed is not None and time.monotonic() - renewed < self.lease_duration_s

    def holds(self, tenure: Tenure) -> bool:
        """Whether ``tenure`` still holds the Lease unexpired (a reconcile leaves its drains
        alone); True when the Lease cannot be read."""
        try:
            with self._lock:
                lease = self._read()
        except API_ERRORS:
            return True
        spec = (lease or {}).get("spec") or {}
        if str(spec.get("holderIdentity") or "") != tenure.identity:
            return False
        if int(spec.get("leaseTransitions") or 0) != tenure.generation:
            return False
        renewed = _parse_time(spec.get("renewTime")) or _parse_time(spec.get("acquireTime"))
        duration = int(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        return renewed is not None and self._now() < renewed + timedelta(seconds=duration)

    def _spec(self, now: datetime, acquire: bool, transitions: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration_s,
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }
        if acquire:
            spec["acquireTime"] = _micro(now)
        return spec

    def _read(self) -> dict[str, Any] | None:
        try:
            response = self.call(
                lambda: _loaded(
                    self.coordination.read_namespaced_lease(
                        self.name,
                        self.namespace,
                        _preload_content=False,
                        _request_timeout=self.call.timeout,
                    )
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data: dict[str, Any] = json.loads(response.data)
        return data

    def release(self) -> None:
        """Give the Lease up if we hold it (holder cleared, as client-go's ReleaseOnCancel)."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        try:
            lease = self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {
                **lease["spec"],
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": _micro(self._now()),
            }
            self._renewed_at, self._generation = None, -1
            self.call(self._replace({**lease, "spec": spec}))
            self.last = LeaderStatus(False, "", "released the Lease")
        except API_ERRORS as exc:
            log.warning(
                "cannot release the Lease %s/%s: %s", self.namespace, self.name, _describe(exc)
            )

    # --- the window's spend (defrag.ports.SpendRecord) -------------------------------------

    def load(self) -> dict[str, object] | None:
        """The spend recorded on the Lease (None when there is none); SpendUnreadable when the
        Lease cannot be read or the annotation is not a spend."""
        where = f"annotation {WINDOW_SPEND_ANNOTATION} on Lease {self.namespace}/{self.name}"
        try:
            with self._lock:
                lease = self._read()
        except API_ERRORS as exc:
            raise SpendUnreadable(f"cannot read the {where}: {_describe(exc)}") from None
        annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(WINDOW_SPEND_ANNOTATION)
        if raw is None:
            return None
        try:
            data = jsonio.loads(raw)
        except ValueError as exc:
            raise SpendUnreadable(f"{where} is not JSON: {exc}", malformed=True) from None
        if not isinstance(data, dict):
            raise SpendUnreadable(f"{where} is not a JSON object", malformed=True)
        return data  # its entries are read (and their shape judged) by the executor

    def save(self, spend: Mapping[str, object]) -> Status:
        """Write ``spend`` on the Lease, only while we hold it: with the resourceVersion read
        (a 409 is read again once), the spec untouched. Never raises."""
        text = json.dumps(dict(spend), sort_keys=True, separators=(",", ":"))
        with self._lock:
            for attempt in (1, 2):
                if not self.holds_now():
                    return Status.fail("this replica does not hold the Lease")
                try:
                    lease = self._read()
                    if lease is None or not self._names_us(lease):
                        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
                        return Status.fail(f"the Lease is held by {holder or 'nobody'}, not us")
                    metadata = dict(lease.get("metadata") or {})
                    annotations = dict(metadata.get("annotations") or {})
                    annotations[WINDOW_SPEND_ANNOTATION] = text
                    body = {**lease, "metadata": {**metadata, "annotations": annotations}}
                    self.call(self._replace(body))
                    return Status.success()
                except ApiException as exc:
                    if exc.status == 409 and attempt == 1:
                        continue  # changed since our read: read it again, then decide
                    return Status.fail(f"the Lease was not written: {_describe(exc)}")
                except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
                    return Status.fail(f"the Lease was not written: {_describe(exc)}")
        return Status.fail("the Lease was not written")  # pragma: no cover (loop returns)

    def __enter__(self) -> LeaseElector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
