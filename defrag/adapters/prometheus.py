"""Prometheus as a :class:`~defrag.ports.MetricsSource` (prometheus-api-client).

Instant and range queries with bounded retries and a timeout, a bearer token read from a file
on every request (projected service-account tokens rotate) and a CA bundle. Failures raise
:class:`MetricsError` subclasses whose message names the server, the query and what Prometheus
itself said.

It also reads which GPU indices each pod holds from DCGM's per-GPU pod labels
(:func:`gpu_indices_by_pod`), with the ``exported_*`` label variant a ServiceMonitor without
``honorLabels`` produces, and applies them to a cluster's pods (:func:`apply_gpu_indices`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from defrag.detect.leak import DcgmLabels
from defrag.model.cluster import Cluster, ModelError
from defrag.model.resources import GPU_INDICES_ANNOTATION
from defrag.ports import Sample


class MetricsError(RuntimeError):
    """Prometheus could not answer a query."""

    def __init__(self, message: str, query: str = "") -> None:
        super().__init__(message)
        self.query = query


class PrometheusUnreachable(MetricsError):
    """No connection, a timeout, or server errors past the retries."""


class PromQLError(MetricsError):
    """Prometheus refused the query (bad PromQL, bad parameters); carries its own message."""

    def __init__(self, query: str, prometheus_message: str) -> None:
        super().__init__(f"Prometheus rejected query {query!r}: {prometheus_message}", query)
        self.prometheus_message = prometheus_message


class PrometheusSource:
    """Queries one Prometheus server. Plain constructor arguments; settings live elsewhere."""

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
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._token_file = Path(bearer_token_file) if bearer_token_file else None
        self._headers = dict(headers or {})
        session = requests.Session()
        session.verify = str(ca_bundle) if ca_bundle else verify_tls
        retry = Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            backoff_factor=backoff_s,
            status_forcelist=(429, 502, 503, 504),
            allowed_methods=frozenset({"GET", "POST"}),
            raise_on_status=False,
        )
        self._client = PrometheusConnect(
            url=self.url,
            headers=self._headers,
            retry=retry,
            session=session,
            timeout=timeout_s,  # type: ignore[arg-type,unused-ignore]  # requests takes float
        )

    def close(self) -> None:
        self._client.close()

    # --- MetricsSource -------------------------------------------------------------------------

    def instant(self, query: str, at: datetime | None = None) -> list[Sample]:
        params = {"time": f"{at.timestamp():.3f}"} if at is not None else None
        data = self._call(query, lambda: self._client.custom_query(query, params=params))
        return _to_samples(data)

    def range(self, query: str, start: datetime, end: datetime, step_s: float) -> list[Sample]:
        if end < start:
            raise ValueError(f"range end {end} before start {start}")
        # The client rounds start/end to whole seconds itself; step in seconds as a float.
        data = self._call(
            query,
            lambda: self._client.custom_query_range(query, start, end, step=f"{step_s:g}"),
        )
        return _to_samples(data)

    # --- internals -----------------------------------------------------------------------------

    def _call(self, query: str, send: Any) -> Any:
        self._client.headers = self._auth_headers()
        try:
            return send()
        except PrometheusApiClientException as exc:
            status, message = _prometheus_error(str(exc))
            if status is not None and 400 <= status < 500 and status not in (401, 403, 429):
                raise PromQLError(query, message) from None
            raise PrometheusUnreachable(
                f"Prometheus at {self.url} failed query {query!r}: {message}", query
            ) from None
        except requests.exceptions.Timeout:
            raise PrometheusUnreachable(
                f"Prometheus at {self.url} did not answer query {query!r} within "
                f"{self.timeout_s:g} s",
                query,
            ) from None
        except requests.exceptions.RequestException as exc:
            raise PrometheusUnreachable(
                f"Prometheus at {self.url} is unreachable ({_root_cause(exc)}); query {query!r}",
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


def _to_samples(data: Any) -> list[Sample]:
    """Prometheus result JSON (vector, matrix or scalar) as :class:`Sample` objects."""
    if isinstance(data, list) and len(data) == 2 and not isinstance(data[0], dict):
        return [Sample({}, ((float(data[0]), float(data[1])),))]  # a scalar result
    out = []
    for item in data or []:
        labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
        if "values" in item:
            points = tuple((float(t), float(v)) for t, v in item["values"])
        else:
            t, v = item["value"]
            points = ((float(t), float(v)),)
        out.append(Sample(labels, points))
    return out


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
    return text.split(": ", 1)[-1] if "Errno" in text or "Max retries" in text else text


# --- GPU indices from DCGM labels --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodGpus:
    node: str
    gpus: tuple[int, ...]


def gpu_indices_by_pod(
    metrics: Any, query: str, at: datetime | None = None, labels: DcgmLabels | None = None
) -> dict[str, PodGpus]:
    """Which GPU indices each pod holds, from a per-GPU DCGM query (e.g. FB used).

    ``metrics`` is any MetricsSource. Series without a pod label (free GPUs) are skipped;
    indices come back sorted.
    """
    names = labels or DcgmLabels()
    seen: dict[str, tuple[str, set[int]]] = {}
    for sample in metrics.instant(query, at):
        key = names.pod_key(sample.labels)
        node = names.first(sample.labels, names.node)
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
