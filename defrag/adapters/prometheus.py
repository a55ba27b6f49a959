"""Prometheus as a :class:`~defrag.ports.MetricsSource` (prometheus-api-client).

Instant and range queries with bounded retries and a timeout, a bearer token read from a file
on every request (projected service-account tokens rotate) and a CA bundle. Failures raise
:class:`MetricsError` subclasses whose message names the server, the query and what Prometheus
itself said.

It also reads which GPU indices each pod holds from DCGM's per-GPU pod labels
(:func:`gpu_indices_by_pod`), with every label variant dcgm-exporter and a ServiceMonitor
without ``honorLabels`` produce (:class:`~defrag.detectors.leak.core.DcgmLabels`), and applies
them to a cluster's pods (:func:`apply_gpu_indices`).
"""

from __future__ import annotations

import ast
import codecs
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from defrag.adapters import jsonio
from defrag.adapters.deadline import (
    Deadline,
    DeadlineAdapter,
    current_budget,
    request_deadline,
    time_budget,
)
from defrag.detectors.leak.core import DcgmLabels
from defrag.model.cluster import Cluster, ModelError
from defrag.model.gc_policy import gc_deferred
from defrag.model.resources import GPU_INDICES_ANNOTATION
from defrag.ports import Query, Sample, ask
from defrag.redact import redact_text, redact_url


class MetricsError(RuntimeError):
    """Prometheus could not answer a query."""

    def __init__(self, message: str, query: str = "") -> None:
        super().__init__(message)
        self.query = query


class PrometheusUnreachable(MetricsError):
    """No connection, past the deadline, or server errors past the retries."""


class PrometheusBadAnswer(MetricsError):
    """Prometheus (or whatever answers at its URL) sent something that is not an API answer."""


class PromQLError(MetricsError):
    """Prometheus refused the query (bad PromQL, bad parameters); carries its own message."""

    def __init__(self, query: str, prometheus_message: str) -> None:
        super().__init__(f"Prometheus rejected query {query!r}: {prometheus_message}", query)
        self.prometheus_message = prometheus_message


RETRY_STATUSES = frozenset({429, 502, 503, 504})

CONCURRENT_QUERIES = 4
"""By default, at most this many of :meth:`PrometheusSource.ask_all`'s queries in flight at once
(``concurrency``; the setting ``prometheus.concurrent_queries``)."""

POST_ABOVE_CHARS = 4000
"""Longer queries go in a POST body: proxies in front of Prometheus commonly refuse request
lines of 4–8 KiB, and the leak rule's range names the GPUs it wants (hundreds of KiB)."""


class PrometheusSource:
    """Queries one Prometheus server. Plain constructor arguments; settings live elsewhere.

    ``timeout_s`` is a wall-clock deadline on the whole query — connecting, every read of a
    slow or trickling answer, and the retries (``retries`` more attempts after connection
    errors and 429/502/503/504, with doubling ``backoff_s``, while time is left). A watchdog
    shuts the query's socket down at the deadline, so no read outlives it
    (:mod:`defrag.adapters.deadline`); inside a command's or cycle's
    :func:`~defrag.adapters.deadline.time_budget` the query ends by the budget's end too.

    Queries are sent through the ``requests.Session`` given to prometheus-api-client, as the
    client sends them, and the deadline works on that session's sockets; the answers are
    decoded here (:func:`_result`: orjson where it gives what ``response.json()`` gives), not
    by the client.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        bearer_token_file: str | Path | None = None,
        ca_bundle: str | Path | None = None,
        verify_tls: bool = True,
        headers: Mapping[str, str] | None = None,
        concurrency: int = CONCURRENT_QUERIES,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"Prometheus URL must start with http:// or https://, got {redact_url(url)!r}"
            )
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout_s!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency!r}")
        self.concurrency = concurrency
        """The most queries :meth:`ask_all` has in flight at once; queries split into shards
        (the leak rule's) make at least this many."""
        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)
        """The URL as logs and messages show it (no credentials)."""
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._token_file = Path(bearer_token_file) if bearer_token_file else None
        self._headers = dict(headers or {})
        session = requests.Session()
        session.verify = str(ca_bundle) if ca_bundle else verify_tls
        self._session = session
        self._client = PrometheusConnect(
            url=self.url,
            headers=self._headers,
            retry=Retry(0, read=False),
            session=session,
            timeout=timeout_s,  # type: ignore[arg-type,unused-ignore]  # requests takes float
        )
        # Our adapter replaces the client's for this URL: retries happen in _call, under the
        # deadline, and every connection it opens is watched.
        session.mount(self.url, DeadlineAdapter(max_retries=0))
        self._unreachable: str | None = None

    def probe(self, timeout_s: float | None = None) -> str | None:
        """Connect once, within ``timeout_s`` (:mod:`defrag.adapters.reach`): when no
        connection can be made, the reason — and from then on every query of this source fails
        at once with it, without retries. A one-shot command asks this before its queries; a
        serving daemon, whose Prometheus may come back, does not."""
        from defrag.adapters.reach import CONNECT_TIMEOUT_S, unreachable_reason

        self._unreachable = unreachable_reason(self.url, timeout_s or CONNECT_TIMEOUT_S)
        return self._unreachable

    def close(self) -> None:
        self._client.close()

    # --- MetricsSource -------------------------------------------------------------------------

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        form = {"query": query}
        if at is not None:
            form["time"] = f"{at.timestamp():.3f}"
        if len(query) > POST_ABOVE_CHARS:
            return self._call(query, lambda t: self._post("/api/v1/query", form, t))
        return self._call(query, lambda t: self._get("/api/v1/query", form, t))

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        if end < start:
            raise ValueError(f"range end {end} before start {start}")
        # start and end to the millisecond (Prometheus's resolution), so a range ending at a
        # recording rule's evaluation time has its points exactly there; whole seconds as the
        # client writes them; step in seconds as a float
        form = {"query": query, "start": _stamp(start), "end": _stamp(end), "step": f"{step_s:g}"}
        if len(query) > POST_ABOVE_CHARS:
            return self._call(query, lambda t: self._post("/api/v1/query_range", form, t))
        return self._call(query, lambda t: self._get("/api/v1/query_range", form, t))

    def ask_all(self, queries: Sequence[Query]) -> list[list[Sample]]:
        """Every query at once, one thread each (at most :data:`CONCURRENT_QUERIES`): the server
        evaluates them on its cores while the answers already back are decoded. Each query has
        its own deadline; the caller's :func:`~defrag.adapters.deadline.time_budget` bounds
        them all. Answers in the order asked; the first query of that order that failed
        raises."""
        if len(queries) <= 1:
            return [ask(self, q) for q in queries]
        budget = current_budget()

        def one(query: Query) -> list[Sample]:
            if budget is None:
                return ask(self, query)
            with time_budget(budget.remaining(), budget.what):
                return ask(self, query)

        workers = min(len(queries), self.concurrency)
        with ThreadPoolExecutor(workers, thread_name_prefix="prometheus") as pool:
            futures = [pool.submit(one, q) for q in queries]
            return [f.result() for f in futures]

    # --- internals -----------------------------------------------------------------------------

    def _post(self, path: str, form: Mapping[str, str], timeout: Any) -> Any:
        """A query form-encoded in a POST body, as Prometheus's API takes ``/api/v1/query`` and
        ``/api/v1/query_range`` for queries that may breach a URL length limit
        (prometheus/prometheus docs/querying/api.md, "Instant queries" and "Range queries").
        Answered and failing as a GET: ``data.result``; a non-200 raises the client's
        exception with the text :func:`_prometheus_error` reads."""
        response = self._session.post(
            f"{self.url}{path}", data=dict(form), timeout=timeout, **self._sent_as_the_client()
        )
        return _result(response)

    def _get(self, path: str, params: Mapping[str, str], timeout: Any) -> Any:
        """A GET with ``params``, the request prometheus-api-client's ``custom_query`` and
        ``custom_query_range`` send (the same URL, parameters, headers and session), answered as
        :meth:`_post`; a range's start and end as given (the client's rounds them to whole
        seconds)."""
        response = self._session.get(
            f"{self.url}{path}", params=dict(params), timeout=timeout, **self._sent_as_the_client()
        )
        return _result(response)

    def _sent_as_the_client(self) -> dict[str, Any]:
        """The request options prometheus-api-client passes: its headers, and the session's
        own ``verify`` and ``cert`` stated (stated, a CA bundle given here is used even where
        ``REQUESTS_CA_BUNDLE`` names another; left to the session, requests would take that
        one)."""
        return {
            "headers": self._client.headers,
            "verify": self._session.verify,
            "cert": self._session.cert,
        }

    def _call(self, query: str, send: Callable[[Any], Any]) -> list[Sample]:
        """``send`` under one deadline for the whole query, retries included."""
        if self._unreachable is not None:
            raise PrometheusUnreachable(
                f"Prometheus at {self.shown} is unreachable ({self._unreachable}); query {query!r}",
                query,
            )
        self._client.headers = self._auth_headers()
        with request_deadline(self.timeout_s) as deadline:
            attempt = 0
            while True:
                try:
                    return self._attempt(query, send, deadline)
                except _RetryableError as exc:
                    wait = self.backoff_s * 2**attempt
                    attempt += 1
                    if attempt > self.retries or deadline.remaining() <= wait:
                        raise PrometheusUnreachable(str(exc), query) from None
                    time.sleep(wait)

    def _attempt(self, query: str, send: Callable[[Any], Any], deadline: Deadline) -> Any:
        if deadline.by_budget:
            late = (
                f"Prometheus at {self.shown} did not answer query {query!r} before {deadline.why}"
            )
        else:
            late = (
                f"Prometheus at {self.shown} did not answer query {query!r} within "
                f"{self.timeout_s:g} s (the whole request)"
            )
        remaining = deadline.remaining()
        if remaining <= 0:
            raise PrometheusUnreachable(late, query)
        try:
            data = send(remaining)
        except PrometheusApiClientException as exc:
            status, message = _prometheus_error(str(exc))
            message = redact_text(message)
            if status is not None and 400 <= status < 500 and status not in (401, 403, 429):
                raise PromQLError(query, message) from None
            text = f"Prometheus at {self.shown} failed query {query!r}: {message}"
            if status in RETRY_STATUSES:
                raise _RetryableError(text) from None
            raise PrometheusUnreachable(text, query) from None
        except requests.exceptions.JSONDecodeError as exc:
            if deadline.expired:
                raise PrometheusUnreachable(late, query) from None
            raise PrometheusBadAnswer(
                f"Prometheus at {self.shown} answered query {query!r} with something that is "
                f"not JSON ({exc.msg} at character {exc.pos})",
                query,
            ) from None
        except requests.exceptions.RequestException as exc:
            if deadline.expired or isinstance(exc, requests.exceptions.Timeout):
                raise PrometheusUnreachable(late, query) from None
            raise _RetryableError(
                f"Prometheus at {self.shown} is unreachable ({_root_cause(exc)}); query {query!r}"
            ) from None
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise PrometheusBadAnswer(
                f"Prometheus at {self.shown} answered query {query!r} with JSON that is not a "
                f"Prometheus API answer (no data.result: {type(exc).__name__} {exc})",
                query,
            ) from None
        try:
            with gc_deferred(None):  # a burst of acyclic tuples: see _result
                return _to_samples(data)
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            raise PrometheusBadAnswer(
                f"Prometheus at {self.shown} answered query {query!r} with a result of the wrong "
                f"shape ({type(exc).__name__}: {str(exc)[:200]}); want a vector, matrix or "
                "scalar",
                query,
            ) from None

    def _auth_headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        if self._token_file is not None:
            try:
                token = self._token_file.read_text().strip()
            except OSError as exc:
                raise MetricsError(
                    f"cannot read bearer token file {self._token_file}: {exc.strerror}"
                ) from None
            headers["Authorization"] = f"Bearer {token}"
        return headers


def _result(response: requests.Response) -> Any:
    """``data.result`` of an answer, as the client reads it (``response.json()["data"]
    ["result"]``); a non-200 raises the client's exception, with the text
    :func:`_prometheus_error` reads.

    A range answer over thousands of GPUs is millions of small lists, floats and strings that
    make no reference cycles; at its default thresholds the cyclic collector walked them again
    and again while they were made (more CPU than decoding them), so it is paused meanwhile
    (:func:`~defrag.model.gc_policy.gc_deferred`; restored after)."""
    if response.status_code != 200:
        raise PrometheusApiClientException(
            f"HTTP Status Code {response.status_code} ({response.content!r})"
        )
    with gc_deferred(None):
        return _decoded(response)["data"]["result"]


def _decoded(response: requests.Response) -> Any:
    """``response.json()``: the same value or the same error, by orjson
    (:func:`~defrag.adapters.jsonio.loads`) where that is sure to be the same — a UTF-8 body
    (the charset Prometheus's ``application/json`` implies, or none) that starts as an object
    does, so no byte-order mark and no UTF-16/32 that :mod:`json` would detect and requests
    would not. Anything else, or a body it cannot decode, is decoded by requests as before."""
    content = response.content
    if content[:1] == b"{" and content[1:2] != b"\0" and _utf8(response.encoding):
        try:
            return jsonio.loads(content)
        except ValueError:  # not JSON, or not UTF-8: requests' own answer or error, below
            pass
    return response.json()


def _utf8(encoding: str | None) -> bool:
    """Whether requests decodes a body in ``encoding`` as UTF-8 (None: it guesses, UTF-8 for a
    body with no NUL bytes and no byte-order mark)."""
    if encoding is None:
        return True
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def _whole_seconds(at: datetime) -> bool:
    return at.microsecond == 0


def _stamp(at: datetime) -> str:
    """Unix seconds as Prometheus's API takes them: whole when whole, else to the millisecond
    (its resolution)."""
    if _whole_seconds(at):
        return str(round(at.timestamp()))
    return f"{at.timestamp():.3f}"


class _RetryableError(Exception):
    """One attempt failed in a way another attempt may not (no connection, 429, 5xx)."""


def _to_samples(data: Any) -> list[Sample]:
    """Prometheus result JSON (vector, matrix or scalar) as :class:`Sample` objects."""
    if isinstance(data, list) and len(data) == 2 and not isinstance(data[0], dict):
        return [Sample({}, ((float(data[0]), float(data[1])),))]  # a scalar result
    if not isinstance(data, list):
        raise TypeError(f"result is a JSON {type(data).__name__}, not a list")
    out = []
    for item in data:
        if not isinstance(item, dict):
            raise TypeError(f"a result item is a JSON {type(item).__name__}, not an object")
        metric = item.get("metric", {})
        if not isinstance(metric, dict):
            raise TypeError("a result item's metric is not an object")
        labels = metric if _all_text(metric) else {str(k): str(v) for k, v in metric.items()}
        if "values" in item:
            points = tuple([(float(t), float(v)) for t, v in item["values"]])
        else:
            t, v = item["value"]
            points = ((float(t), float(v)),)
        out.append(Sample(labels, points))
    return out


def _all_text(metric: dict[Any, Any]) -> bool:
    """Whether every label name and value is a string, as in every answer of Prometheus's: the
    decoded object, this call's own, is then the labels as they are (``str`` of a string
    decoded from JSON is that string); else each is made one. ``str.join`` checks each in C."""
    try:
        "".join(metric)
        "".join(metric.values())
    except TypeError:
        return False
    return True


_STATUS = re.compile(r"HTTP Status Code (\d+) \((.*)\)\s*$", re.S)


def _prometheus_error(text: str) -> tuple[int | None, str]:
    """Status and Prometheus's own ``error`` field from the client's exception text."""
    match = _STATUS.match(text)
    if not match:
        return None, text
    status, body = int(match.group(1)), match.group(2)
    try:
        raw = ast.literal_eval(body)
        decoded = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    except (ValueError, SyntaxError):
        decoded = body
    try:
        payload = json.loads(decoded)
    except ValueError:
        return status, f"HTTP {status}: {decoded.strip()[:300]}"
    if isinstance(payload, dict) and payload.get("error"):
        kind = payload.get("errorType", "error")
        return status, f"{kind}: {payload['error']}"
    return status, f"HTTP {status}: {decoded.strip()[:300]}"


def _root_cause(exc: BaseException) -> str:
    inner: BaseException = exc
    while inner.__context__ is not None and inner.__context__ is not inner:
        inner = inner.__context__
    text = str(inner) or type(inner).__name__
    text = text.split(": ", 1)[-1] if "Errno" in text or "Max retries" in text else text
    return redact_text(text)


# --- GPU indices from DCGM labels --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodGpus:
    node: str
    gpus: tuple[int, ...]


def gpu_indices_by_pod(
    metrics: Any, query: str, at: datetime | None = None, labels: DcgmLabels | None = None
) -> dict[str, PodGpus]:
    """Which GPU indices each pod holds, from a per-GPU DCGM query (e.g. FB used).

    ``metrics`` is any MetricsSource. Series without a workload pod label (free GPUs, or only
    the exporter's own pod behind a ServiceMonitor) are skipped; indices come back sorted.
    """
    names = labels or DcgmLabels()
    seen: dict[str, tuple[str, set[int]]] = {}
    samples = metrics.instant(query, at)
    targets = names.target_pods(s.labels for s in samples)
    for sample in samples:
        key = names.pod_key(sample.labels, targets)
        node = names.node_of(sample.labels)
        gpu = sample.labels.get(names.gpu, "")
        if key is None or not node or not gpu.isdigit():
            continue
        entry = seen.setdefault(key, (node, set()))
        if entry[0] == node:
            entry[1].add(int(gpu))
    return {k: PodGpus(node, tuple(sorted(g))) for k, (node, g) in sorted(seen.items())}


@dataclass(frozen=True, slots=True)
class IndexUpdate:
    """What :func:`apply_gpu_indices` did: pods updated, and pods left alone with the reason."""

    cluster: Cluster
    applied: tuple[str, ...]
    skipped: Mapping[str, str]


def apply_gpu_indices(cluster: Cluster, holdings: Mapping[str, PodGpus]) -> IndexUpdate:
    """Give bound pods the GPU indices DCGM reports; pods DCGM disagrees with are skipped."""
    skipped: dict[str, str] = {}
    known: dict[str, tuple[int, ...]] = {}
    for key, held in holdings.items():
        pod = cluster.pods.get(key)
        if pod is None or pod.node is None:
            skipped[key] = "not a bound pod of the cluster"
        elif pod.node != held.node:
            skipped[key] = f"bound to {pod.node}, DCGM sees it on {held.node}"
        elif len(held.gpus) != pod.num_gpu:
            skipped[key] = f"requests {pod.num_gpu} GPU(s), DCGM sees {len(held.gpus)}"
        else:
            known[key] = held.gpus
    # Pods with known indices first, so automatic assignment of the rest cannot take them; the
    # rest are re-assigned unless their indices were stated (annotation) rather than guessed.
    pods = [replace(p, gpu_indices=known[p.key]) for p in cluster.pods.values() if p.key in known]
    pods += [
        p if GPU_INDICES_ANNOTATION in p.annotations else replace(p, gpu_indices=())
        for p in cluster.pods.values()
        if p.key not in known
    ]
    try:
        updated = Cluster.build(
            cluster.nodes, pods, cluster.pdbs, cluster.priority_classes, warnings=cluster.warnings
        )
    except ModelError as exc:
        return IndexUpdate(cluster, (), {k: f"not applied: {exc}" for k in known} | skipped)
    return IndexUpdate(updated, tuple(sorted(known)), skipped)
