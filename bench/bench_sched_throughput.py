"""Pods bound per second by the real kube-scheduler, with and without the defrag extender in
its path, on the e2e suite's control plane.

    .venv/bin/python -m bench.bench_sched_throughput --nodes 1000,5000 --pods 2000 --runs 3

For each size, ``--nodes`` fake GPU nodes (8 GPUs each, ``tests/e2e/kubelet.add_node``; no
kubelet: a pod only has to be bound) are created once, and the bench waits until no Node
changes for 10 s (kube-controller-manager's TTL controller rewrites every node for minutes
after they were made, :func:`settle_nodes`); then, ``--runs`` times, each mode in turn (the
order rotates from run to run, so that no mode always goes first):

- ``alone``: kube-scheduler with the shipped ``kube-scheduler-config.yaml`` less its
  ``extenders`` (no defrag process running at all);
- ``names``: the shipped configuration, the extender with ``nodeCacheCapable: true``;
- ``nodes``: the same with ``nodeCacheCapable: false`` (whole Node objects in each call);
- ``null``: the ``names`` configuration pointed at an extender that decides nothing
  (``bench/null_extender.py``: every node passes, every score 0, answered from a thread of the
  bench's process): the least any extender in the path costs kube-scheduler on this machine.

A mode: ``--pods`` pods, each asking for 1 ``nvidia.com/gpu`` (a managed resource of the shipped
configuration, so every one goes to the extender) and naming ``schedulerName:
defrag-scheduler``, are all created while no scheduler runs (all at once: a backlog); then
kube-scheduler (and the extender, for the two extender modes, started and ready first) starts
and binds them. Pods bound per second = (pods − 1) / (last binding − first binding), both read
from the API server's audit log (the ``pods/binding`` creates' ``stageTimestamp``), so that
neither the start of kube-scheduler nor the creation of the pods is counted; a mode is
measured at most ``--window`` seconds from its first binding (a slow mode binds fewer pods, the
table says how many). Then the pods are
deleted and the processes stopped.

Beside it: the extender's answers under that load from its own /metrics histogram
(``defrag_extender_request_seconds``: the mean, and the p99 interpolated within its buckets as
Prometheus's ``histogram_quantile`` does), and the mean of kube-scheduler's own
``scheduler_scheduling_algorithm_duration_seconds`` (filter and score, the extender's HTTP
calls included): the difference between the two is kube-scheduler's side of each call.

Settings of kube-scheduler's API client (``--qps``, comma-separated, each measured in every run):
``shipped`` (the shipped configuration sets no ``clientConnection.qps``, so kube-scheduler's
default applies: 50 requests/s, burst 100, kubernetes/kubernetes
pkg/scheduler/apis/config/v1/defaults.go) and ``N`` (qps and burst
N: kube-scheduler's own scheduling speed, without its client rate limit). Leader election is
off (one replica; a fresh Lease per mode would add its wait).

Needs the control plane binaries (``KUBEBUILDER_ASSETS``, ``make kube-assets``) and etcd; without
them prints ``skipped:`` and exits 0, or under ``CI=true`` fails (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3

from bench.calibrate import calibrate
from bench.null_extender import NullExtender
from tests.e2e import cluster as c
from tests.e2e.controlplane import AssetsMissing, ControlPlane, control_plane, find_assets
from tests.e2e.kubelet import add_node
from tests.support.binaries import free_port

MODES = ("alone", "names", "nodes", "null")
BASE = "-base"
"""A mode's suffix when its extender runs another tree's code (``--base DIR``): e.g.
``names-base``, measured in the same run as ``names``."""
NAMESPACE = "throughput"
SCHEDULER = "kube-scheduler-throughput"
METRIC_PATHS = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"


@dataclass(frozen=True, slots=True)
class ModeRun:
    """One mode's measurement."""

    mode: str
    qps: str
    nodes: int
    pods: int
    pods_per_s: float
    bind_span_s: float
    extender_p50_ms: dict[str, float]
    extender_p99_ms: dict[str, float]
    extender_calls: dict[str, int]
    extender_mean_ms: dict[str, float]
    algorithm_mean_ms: float
    view_builds: int = 0
    """Builds of the extender's view (after watch events) while kube-scheduler ran."""
    view_build_s: float = float("nan")
    """The last one's duration."""
    fresh_answers: dict[str, int] = dataclasses.field(default_factory=dict)
    """The extender's filter answers while kube-scheduler ran, by how the view was made fresh
    (``defrag_extender_fresh_answers``: current, ahead, waited)."""
    extender_cpu_ms: float = float("nan")
    """The extender process's CPU time (user + system) while kube-scheduler ran, per filter
    call, in ms."""


# --- reading figures ---------------------------------------------------------------------


def _stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def binding_times(audit_log: Path, offset: int, namespace: str) -> list[float]:
    """The ``stageTimestamp`` of each successful ``pods/binding`` create in ``namespace``
    written to the audit log after byte ``offset``."""
    times = []
    with audit_log.open("rb") as handle:
        handle.seek(offset)
        for raw in handle:
            if not raw.endswith(b"\n"):
                break  # the API server is still writing this line: the next read has it whole
            if b'"binding"' not in raw:
                continue
            event = json.loads(raw)
            ref = event.get("objectRef", {})
            if (
                event.get("stage") == "ResponseComplete"
                and event.get("verb") == "create"
                and ref.get("subresource") == "binding"
                and ref.get("namespace") == namespace
                and event.get("responseStatus", {}).get("code", 0) < 300
            ):
                times.append(_stamp(event["stageTimestamp"]))
    return sorted(times)


SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)$")


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` in a Prometheus text exposition: (labels, value)."""
    found = []
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match is None or match.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        found.append((labels, float(match.group(3))))
    return found


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's ``histogram_quantile`` over cumulative ``(le, count)`` buckets: linear
    interpolation inside the bucket the rank falls in; NaN with no observations."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return float("nan")
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound  # above the largest finite bucket: its bound, as Prometheus
            width = count - lower_count
            inside = (rank - lower_count) / width if width else 1.0
            return lower_bound + (bound - lower_bound) * inside
        lower_bound, lower_count = bound, count
    return lower_bound


def extender_figures(
    text: str,
) -> tuple[dict[str, float], dict[str, float], dict[str, int], dict[str, float]]:
    """p50 and p99 (ms), the number of calls and the mean (ms), per verb, from the extender's
    /metrics."""
    by_verb: dict[str, list[tuple[float, float]]] = {}
    for labels, value in samples(text, "defrag_extender_request_seconds_bucket"):
        by_verb.setdefault(labels["verb"], []).append((float(labels["le"]), value))
    p50 = {v: round(histogram_quantile(0.5, b) * 1e3, 2) for v, b in by_verb.items()}
    p99 = {v: round(histogram_quantile(0.99, b) * 1e3, 2) for v, b in by_verb.items()}
    calls = {
        labels["verb"]: int(value)
        for labels, value in samples(text, "defrag_extender_request_seconds_count")
    }
    sums = {
        labels["verb"]: value
        for labels, value in samples(text, "defrag_extender_request_seconds_sum")
    }
    mean = {v: round(sums[v] / n * 1e3, 2) for v, n in calls.items() if n and v in sums}
    return p50, p99, calls, mean


def view_builds(text: str) -> tuple[int, float]:
    """The extender's view builds so far and the last one's seconds (its /metrics)."""
    builds = sum(v for _, v in samples(text, "defrag_extender_relists_total"))
    last = samples(text, "defrag_extender_relist_seconds")
    return int(builds), (last[0][1] if last else float("nan"))


def fresh_answers(text: str) -> dict[str, int]:
    """The extender's fresh answers so far by how (its /metrics)."""
    return {
        labels["how"]: int(value)
        for labels, value in samples(text, "defrag_extender_fresh_answers_total")
    }


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, user + system (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def algorithm_mean_ms(text: str) -> float:
    """kube-scheduler's mean scheduling-algorithm time (filter and score, extender calls
    included), over every attempt so far."""
    total = sum(v for _, v in samples(text, "scheduler_scheduling_algorithm_duration_seconds_sum"))
    count = sum(
        v for _, v in samples(text, "scheduler_scheduling_algorithm_duration_seconds_count")
    )
    return round(total / count * 1e3, 3) if count else float("nan")


def scheduler_metrics(port: int) -> str:
    with warnings.catch_warnings():  # its serving certificate is self-signed
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        answer = requests.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=10)
    answer.raise_for_status()
    return answer.text


# --- the cluster ---------------------------------------------------------------------------


def add_nodes(plane: ControlPlane, prefix: str, count: int, threads: int) -> list[str]:
    names = [f"{prefix}-{i:05d}" for i in range(count)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda n: add_node(plane.admin, n, 8), names))
    return names


def node_events(plane: ControlPlane, seconds: int) -> int:
    """How many Node events (ADDED / MODIFIED / DELETED) the API server sends in ``seconds``
    from now (a watch from the list's resourceVersion, ended by the server)."""
    version = plane.admin.get("/api/v1/nodes", limit=1)["metadata"]["resourceVersion"]
    answer = plane.admin.session.get(
        plane.admin.url("/api/v1/nodes"),
        params={"watch": "1", "resourceVersion": version, "timeoutSeconds": str(seconds)},
        stream=True,
        timeout=seconds + 30,
    )
    answer.raise_for_status()
    with answer:
        return sum(1 for line in answer.iter_lines() if line and b'"BOOKMARK"' not in line[:40])


def settle_nodes(plane: ControlPlane, quiet_s: int = 10, limit_s: float = 900) -> tuple[float, int]:
    """Wait until no Node changes for ``quiet_s`` (at most ``limit_s``): the seconds waited
    and the Node events seen meanwhile.

    kube-controller-manager keeps writing the nodes for minutes after they were made (its TTL
    controller sets every node's ``node.alpha.kubernetes.io/ttl`` annotation by the cluster's
    size, kubernetes/kubernetes pkg/controller/ttl, at its API client's rate): each write is a
    node change, which the extender builds in full and does not answer ahead of the build.
    Measured before they end, the first modes would count that churn, not scheduling."""
    started, seen = time.monotonic(), 0
    while time.monotonic() - started < limit_s:
        events = node_events(plane, quiet_s)
        seen += events
        if not events:
            break
    return time.monotonic() - started, seen


def create_pods(plane: ControlPlane, count: int, threads: int) -> None:
    def one(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i:06d}", "namespace": NAMESPACE, "labels": {"app": "tp"}},
            "spec": c.pod_spec(1),
        }
        plane.admin.post(f"/api/v1/namespaces/{NAMESPACE}/pods", body)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))


def delete_pods(plane: ControlPlane, timeout_s: float = 300) -> None:
    """Every pod of the namespace, at once (grace 0: no kubelet would ever confirm)."""
    plane.admin.session.delete(
        plane.admin.url(f"/api/v1/namespaces/{NAMESPACE}/pods"),
        json={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
        timeout=120,
    )
    deadline = time.monotonic() + timeout_s
    while plane.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods", limit=1)["items"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the pods were not deleted")
        time.sleep(0.5)


def scheduler_config(mode: str, extender_port: int, qps: str) -> dict[str, Any]:
    mode = mode.removesuffix(BASE)
    config = c.scheduler_config(extender_port, node_cache_capable=mode != "nodes")
    config["leaderElection"] = {"leaderElect": False}
    if mode == "alone":
        del config["extenders"]
    if qps != "shipped":
        config["clientConnection"] = {"qps": int(qps), "burst": int(qps)}
    return config


@contextlib.contextmanager
def extender_for(
    mode: str,
    plane: ControlPlane,
    kubeconfig: Path,
    settings: Path,
    port: int,
    base: Path | None = None,
) -> Iterator[c.Served | NullExtender | None]:
    """The extender of ``mode`` (none alone; the null one in its own process); a ``-base``
    mode's runs ``base``'s code (its directory first on PYTHONPATH, in the extender's process
    only)."""
    if mode == "alone":
        yield None
        return
    if mode == "null":
        with NullExtender(port) as null:
            yield null
        return
    with contextlib.ExitStack() as stack:
        path: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if mode.endswith(BASE):
            if base is None:
                raise ValueError(f"{mode}: needs --base")
            path = _pythonpath(base)
        with path:  # only while its process starts
            served = stack.enter_context(
                c.extender(plane, kubeconfig, settings, name=f"extender-{mode}", port=port)
            )
        yield served


@contextlib.contextmanager
def _pythonpath(folder: Path) -> Iterator[None]:
    """PYTHONPATH set to ``folder`` while a child process is spawned (it inherits the
    environment as it is at its start)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def run_mode(
    plane: ControlPlane,
    mode: str,
    nodes: int,
    pods: int,
    qps: str,
    folder: Path,
    threads: int,
    window_s: float,
    base: Path | None = None,
) -> ModeRun:
    create_pods(plane, pods, threads)
    sched_kc = plane.service_account_kubeconfig("defrag-system", "defrag-scheduler")
    settings = c.write_yaml(folder / "settings.yaml", {"scoring": {"policy": "reserve-binpack"}})
    port = free_port()
    offset = plane.audit_log.stat().st_size
    p50: dict[str, float] = {}
    p99: dict[str, float] = {}
    calls: dict[str, int] = {}
    mean: dict[str, float] = {}
    builds, build_s = 0, float("nan")
    fresh: dict[str, int] = {}
    cpu_ms = float("nan")
    with extender_for(mode, plane, sched_kc, settings, port, base) as ext:
        builds_before, fresh_before, cpu_before = 0, {}, 0.0
        if isinstance(ext, NullExtender):
            cpu_before = cpu_seconds(ext.pid)
        elif ext is not None:
            text = ext.get("/metrics").text
            builds_before, fresh_before = view_builds(text)[0], fresh_answers(text)
            cpu_before = cpu_seconds(ext.process.proc.pid)
        try:
            # /metrics opened to anonymous reads, as /readyz is by default
            plane.start_scheduler(
                scheduler_config(mode, port, qps), sched_kc, SCHEDULER, extra=(METRIC_PATHS,)
            )
            deadline = time.monotonic() + 120.0  # for the first binding
            while True:
                bound = binding_times(plane.audit_log, offset, NAMESPACE)
                if len(bound) >= pods or (bound and time.time() - bound[0] > window_s):
                    break
                if not bound and time.monotonic() > deadline:
                    raise TimeoutError(f"{mode}: no pod bound in 120 s")
                time.sleep(1.0)
            algorithm = algorithm_mean_ms(scheduler_metrics(plane.scheduler_ports[SCHEDULER]))
            if isinstance(ext, NullExtender):
                # what even an extender that decides nothing costs of the 2 cores, per pod
                calls = {"filter": ext.filter_calls}
                if calls["filter"]:
                    used = cpu_seconds(ext.pid) - cpu_before
                    cpu_ms = round(used * 1e3 / calls["filter"], 2)
            elif ext is not None:
                text = ext.get("/metrics").text
                p50, p99, calls, mean = extender_figures(text)
                builds, build_s = view_builds(text)
                builds -= builds_before
                fresh = {
                    how: n - fresh_before.get(how, 0) for how, n in fresh_answers(text).items()
                }
                used = cpu_seconds(ext.process.proc.pid) - cpu_before
                if calls.get("filter"):
                    cpu_ms = round(used * 1e3 / calls["filter"], 2)
        finally:
            if SCHEDULER in plane.processes:
                plane.processes.pop(SCHEDULER).stop()
    times = binding_times(plane.audit_log, offset, NAMESPACE)
    times = [t for t in times if t - times[0] <= window_s]
    span = times[-1] - times[0]
    delete_pods(plane)
    return ModeRun(
        mode=mode,
        qps=qps,
        nodes=nodes,
        pods=len(times),
        pods_per_s=round((len(times) - 1) / span, 1) if span > 0 else float("nan"),
        bind_span_s=round(span, 2),
        extender_p50_ms=p50,
        extender_p99_ms=p99,
        extender_calls=calls,
        extender_mean_ms=mean,
        algorithm_mean_ms=algorithm,
        view_builds=builds,
        view_build_s=round(build_s, 4),
        fresh_answers=fresh,
        extender_cpu_ms=cpu_ms,
    )


# --- reporting -----------------------------------------------------------------------------


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:g}"
    return f"{min(values):g} / {statistics.median(values):g} / {max(values):g}"


def report(results: list[ModeRun]) -> list[str]:
    """The table (min / median / max over the runs) and one line per size and extender mode
    that ``make bench``'s targets read: the cost in % of kube-scheduler's own throughput, from
    the medians."""
    lines = [
        "| nodes | qps | mode | pods bound | pods/s | ÷ alone | algorithm mean ms "
        "| extender mean ms, filter + prioritize | filter p99 ms | prioritize p99 ms "
        "| extender CPU ms a filter call | filter answers ahead / waited, all runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for nodes, qps in sorted({(r.nodes, r.qps) for r in results}):
        at = [r for r in results if r.nodes == nodes and r.qps == qps]
        alone = statistics.median(r.pods_per_s for r in at if r.mode == "alone")
        for mode in [m + suffix for m in MODES for suffix in ("", BASE)]:
            runs = [r for r in at if r.mode == mode]
            if not runs:
                continue
            rate = statistics.median(r.pods_per_s for r in runs)
            cells = [
                str(nodes),
                qps,
                mode,
                _spread([r.pods for r in runs]),
                _spread([r.pods_per_s for r in runs]),
                _spread([round(r.pods_per_s / alone, 3) for r in runs]),
                _spread([r.algorithm_mean_ms for r in runs]),
            ]
            if mode == "alone":
                cells += ["—", "—", "—", "—", "—"]
            else:
                nan = float("nan")
                cells += [
                    _spread([r.extender_mean_ms.get("filter", nan) for r in runs])
                    + " + "
                    + _spread([r.extender_mean_ms.get("prioritize", nan) for r in runs]),
                    _spread([r.extender_p99_ms.get("filter", nan) for r in runs]),
                    _spread([r.extender_p99_ms.get("prioritize", nan) for r in runs]),
                    _spread([r.extender_cpu_ms for r in runs]),
                    " / ".join(
                        f"{sum(r.fresh_answers.get(how, 0) for r in runs)}"
                        for how in ("ahead", "waited")
                    )
                    if any(r.fresh_answers for r in runs)
                    else "—",
                ]
                cost = (1 - rate / alone) * 100
                p99 = statistics.median(
                    max(r.extender_p99_ms.values(), default=float("nan")) for r in runs
                )
                summary.append(
                    f"extender cost, {mode}, {nodes} nodes, qps {qps}: {cost:.1f} % of "
                    f"kube-scheduler's throughput ({rate:g} vs {alone:g} pods/s, median); "
                    f"extender p99 {p99:g} ms"
                )
            lines.append("| " + " | ".join(cells) + " |")
    return lines + summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated cluster sizes")
    parser.add_argument("--pods", type=int, default=2000, help="pods per mode and run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"from {', '.join(MODES)}")
    parser.add_argument(
        "--qps",
        default="shipped",
        help="kube-scheduler's clientConnection qps and burst, comma-separated: 'shipped' "
        "(unset: its default) or a number",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=90.0,
        help="seconds after the first binding a mode is measured at most (a slow mode binds "
        "fewer than --pods in it)",
    )
    parser.add_argument("--threads", type=int, default=16, help="API client threads for setup")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument(
        "--base",
        type=Path,
        help="another checkout (e.g. a worktree of main): the extender modes named with a "
        f"'{BASE}' suffix in --modes (names{BASE}, nodes{BASE}) run its code, in the same run",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    known = {*MODES, *(m + BASE for m in MODES if m not in ("alone", "null"))}
    if set(modes) - known or "alone" not in modes:
        parser.error(f"--modes: from {', '.join(sorted(known))}, alone included")
    if any(m.endswith(BASE) for m in modes) and (args.base is None or not args.base.is_dir()):
        parser.error(f"--base: a checkout's directory is needed for the {BASE} modes")
    qps_list = [q for q in args.qps.split(",") if q]
    if not qps_list or any(q != "shipped" and not q.isdigit() for q in qps_list):
        parser.error("--qps: comma-separated 'shipped' or whole numbers")
    try:
        sizes = [int(n) for n in args.nodes.split(",") if n]
    except ValueError:
        parser.error("--nodes: comma-separated whole numbers")
    try:
        find_assets()
    except AssetsMissing as exc:
        if os.environ.get("CI") == "true":
            print(f"error: {exc} (CI=true: a failure)")
            return 2
        print(f"skipped: {exc}")
        return 0
    # A SIGTERM ends the run through the cleanup (the control plane's processes stopped).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cal = calibrate(3)
    print(f"calibration: {cal:.3f} s; load {os.getloadavg()}", flush=True)
    results: list[ModeRun] = []
    with tempfile.TemporaryDirectory(prefix="defrag-bench-tput-") as tmp:
        folder = Path(tmp)
        with control_plane(folder / "plane") as plane:
            c.apply_rbac(plane)
            c.namespace(plane.admin, NAMESPACE)
            made = 0
            for size in sorted(sizes):
                started = time.monotonic()
                add_nodes(plane, f"n{size}", size - made, args.threads)
                made = size
                one = plane.admin.session.get(
                    plane.admin.url(f"/api/v1/nodes/n{size}-00000"), timeout=30
                )
                print(
                    f"{size} nodes up in {time.monotonic() - started:.0f} s; one Node object "
                    f"as the API server serves it: {len(one.content):,} bytes of JSON",
                    flush=True,
                )
                settled, seen = settle_nodes(plane)
                ttl = plane.admin.get(f"/api/v1/nodes/n{size}-00000")["metadata"].get(
                    "annotations", {}
                )
                print(
                    f"{size} nodes: no Node change for 10 s after {settled:.0f} s ({seen} Node "
                    f"events meanwhile; node.alpha.kubernetes.io/ttl now "
                    f"{ttl.get('node.alpha.kubernetes.io/ttl')})",
                    flush=True,
                )
                for run in range(args.runs):
                    order = modes[run % len(modes) :] + modes[: run % len(modes)]
                    for qps, mode in [(q, m) for q in qps_list for m in order]:
                        result = run_mode(
                            plane,
                            mode,
                            size,
                            args.pods,
                            qps,
                            folder,
                            args.threads,
                            args.window,
                            args.base,
                        )
                        results.append(result)
                        print(
                            f"run {run + 1}/{args.runs} {size} nodes qps {qps} {mode}: "
                            f"{result.pods_per_s} pods/s ({result.pods} in "
                            f"{result.bind_span_s} s), algorithm mean "
                            f"{result.algorithm_mean_ms} ms, extender p99 "
                            f"{result.extender_p99_ms} ms, mean {result.extender_mean_ms} ms; "
                            f"extender view builds {result.view_builds} (last "
                            f"{result.view_build_s} s); filter answers "
                            f"{result.fresh_answers}; extender CPU "
                            f"{result.extender_cpu_ms} ms a filter call; load "
                            f"{os.getloadavg()[0]:.2f}",
                            flush=True,
                        )
    after = calibrate(3)
    for line in report(results):
        print(line)
    print(f"calibration before {cal:.3f} s, after {after:.3f} s; load {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
