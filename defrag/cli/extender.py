"""``defrag extender`` (the kube-scheduler extender) and ``defrag agent`` (the node agent)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from defrag.adapters.heap import keep_heap_small
from defrag.adapters.stop_signal import StopSignal
from defrag.cli.app import (
    Output,
    OutputOpt,
    PortOpt,
    UserError,
    api_server,
    app,
    console,
    err_console,
    parse_duration,
    print_data,
)
from defrag.cli.exitcodes import ExitCode
from defrag.cli.profile import PolicyOpt, SettingsOpt, profile_config
from defrag.extender.pace import serving_pace

if TYPE_CHECKING:
    from defrag.extender.server import ExtenderHTTPServer

HostOpt = Annotated[str, typer.Option(help="Address to bind.", metavar="ADDRESS")]
KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        help="Kubeconfig (default: $KUBECONFIG, else in-cluster, else ~/.kube/config).",
        metavar="PATH",
    ),
]


def _old_name(flag: str) -> Any:
    """The option's name before durations took units (``--relist-interval-s``): still read,
    in seconds as before, and hidden from the help."""
    return typer.Option(f"{flag}-s", hidden=True, metavar="SECONDS")


def _span(text: str, old: str | None, flag: str) -> float:
    """Seconds in ``flag``'s duration (or in its old ``-s`` spelling, when that was given);
    positive and finite."""
    if old is not None:
        text, flag = old, f"{flag}-s"
    seconds = parse_duration(text, flag)
    if not 0 < seconds < 1e6:
        raise UserError(f"{flag}: must be positive and under 11 days, got {text!r}")
    return seconds


def _logging() -> None:
    logging.basicConfig(
        level=os.environ.get("DEFRAG_LOGGING__LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def extender(
    port: Annotated[int, PortOpt("Port to serve /filter and /prioritize on.")] = 8888,
    host: HostOpt = "0.0.0.0",
    snapshot: Annotated[
        list[Path],
        typer.Option(
            "--snapshot",
            "-s",
            help="Serve from snapshot file(s) instead of the API (reread when they change).",
        ),
    ] = [],  # noqa: B006
    policy: PolicyOpt = None,
    settings_file: SettingsOpt = None,
    relist_interval: Annotated[
        str,
        typer.Option(
            help="Between rereads of --snapshot files (the API is watched).", metavar="DURATION"
        ),
    ] = "10s",
    max_staleness: Annotated[
        str,
        typer.Option(help="/readyz fails when the state is older than this.", metavar="DURATION"),
    ] = "120s",
    metrics_port: Annotated[
        int | None,
        PortOpt(
            "Also serve GET /metrics, /healthz and /readyz (nothing else) on this port, for "
            "probes and Prometheus when --host is a loopback address.",
            lowest=1,
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="Address to bind --metrics-port.", metavar="ADDRESS")
    ] = ("0.0.0.0"),
    kubeconfig: KubeconfigOpt = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="PEM certificate: serve HTTPS (kube-scheduler's enableHTTPS)."),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    max_connections: Annotated[
        int,
        typer.Option(help="Connections served at once; more get 503 and are closed.", min=1),
    ] = 64,
    idle_timeout: Annotated[
        str,
        typer.Option(help="Close a keep-alive connection idle this long.", metavar="DURATION"),
    ] = "30s",
    read_timeout: Annotated[
        str,
        typer.Option(
            help="A request's headers and body must arrive within this.", metavar="DURATION"
        ),
    ] = "10s",
    relist_interval_s: Annotated[str | None, _old_name("--relist-interval")] = None,
    max_staleness_s: Annotated[str | None, _old_name("--max-staleness")] = None,
    idle_timeout_s: Annotated[str | None, _old_name("--idle-timeout")] = None,
    read_timeout_s: Annotated[str | None, _old_name("--read-timeout")] = None,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize) with defrag's score function."""
    import ssl

    from defrag.adapters.httpserve import ServerLimits
    from defrag.adapters.sources import SourceError, SourceSpec, SourceUnreachable, open_source
    from defrag.extender.server import serve, serve_status, stop, tls_context

    config = profile_config(settings_file, policy)
    relist_s = _span(relist_interval, relist_interval_s, "--relist-interval")
    staleness_s = _span(max_staleness, max_staleness_s, "--max-staleness")
    idle_s = _span(idle_timeout, idle_timeout_s, "--idle-timeout")
    read_s = _span(read_timeout, read_timeout_s, "--read-timeout")
    if (tls_cert is None) != (tls_key is None):
        raise UserError("--tls-cert and --tls-key go together: give both, or neither")
    tls = None
    if tls_cert is not None and tls_key is not None:
        try:
            tls = tls_context(tls_cert, tls_key)
        except (ssl.SSLError, OSError) as exc:
            raise UserError(
                f"cannot load --tls-cert {tls_cert} / --tls-key {tls_key}: {exc}"
            ) from None
    _logging()
    keep_heap_small()  # before the watch and serving threads start
    # A bad snapshot file is the user's mistake: said now (the factory reads it), not at /readyz.
    # The live API is watched (a freed node is seen at once); snapshot files are re-read.
    spec = (
        SourceSpec(tuple(snapshot))
        if snapshot
        else SourceSpec(live=True, kubeconfig=kubeconfig, watch=True, probe=True)
    )
    try:
        backend = open_source(spec)
    except SourceUnreachable as exc:
        raise UserError(str(exc), ExitCode.UNREACHABLE) from None
    except SourceError as exc:
        raise UserError(str(exc)) from None
    source = backend.source
    try:
        server = serve(
            source,
            profile=config,
            host=host,
            port=port,
            relist_interval_s=relist_s,
            max_staleness_s=staleness_s,
            limits=ServerLimits(max_connections, idle_s, read_s),
            tls=tls,
        )
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc}") from None
    except Exception as exc:  # the first list of the live cluster: refused, cut off, timed out
        if backend.api is None:
            raise
        raise UserError(
            f"{api_server(backend.api)}: cannot list the cluster: {exc}", ExitCode.UNREACHABLE
        ) from None
    servers = [server]
    if metrics_port is not None:
        try:
            servers.append(serve_status(server, metrics_host, metrics_port))
        except OSError as exc:
            stop(server)
            raise UserError(f"cannot listen on {metrics_host}:{metrics_port}: {exc}") from None
    sigterm = StopSignal().install()
    with serving_pace():
        for srv in servers:
            threading.Thread(target=srv.serve_forever, args=(0.2,), daemon=True).start()
        err_console.print(f"defrag extender: policy {config.policy}, serving on {server.url}")
        if len(servers) > 1:
            err_console.print(f"defrag extender: /metrics, /healthz, /readyz on {servers[1].url}")
        try:
            sigterm.wait()
        except KeyboardInterrupt:
            pass
        finally:
            _shutdown(servers)


def _shutdown(servers: list[ExtenderHTTPServer]) -> None:
    """Stop serving (status server first), close the sockets, stop relisting."""
    from defrag.extender.server import stop

    for srv in reversed(servers):
        srv.shutdown()
    for srv in servers[1:]:
        srv.server_close()
    stop(servers[0])


@app.command()
def agent(
    node: Annotated[
        str | None,
        typer.Option(help="This node's name (default: $NODE_NAME, set by the DaemonSet)."),
    ] = None,
    port: Annotated[int, PortOpt("Port for /metrics and /healthz.")] = 9410,
    host: HostOpt = "0.0.0.0",
    interval: Annotated[
        str,
        typer.Option(help="Between topology checks (published on change).", metavar="DURATION"),
    ] = "5m",
    once: Annotated[
        bool, typer.Option("--once", help="Read the GPUs once, publish, print, exit.")
    ] = False,
    publish: Annotated[
        bool, typer.Option(help="Patch the node annotation (--no-publish: only read and print).")
    ] = True,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Output.table,
    interval_s: Annotated[str | None, _old_name("--interval")] = None,
) -> None:
    """The node agent: NVLink domains → node annotation; GPU memory on /metrics.

    Exits 3 when NVML (the NVIDIA driver) is not available on this machine.
    """
    from defrag.adapters.health import HealthServer
    from defrag.adapters.nvml import NvmlInventory, NvmlUnavailable
    from defrag.agent.service import EXIT_NO_NVML, Agent, NodeAnnotator

    interval_seconds = _span(interval, interval_s, "--interval")
    node_name = node or os.environ.get("NODE_NAME") or ""
    if publish and not node_name:
        raise UserError("no node name: pass --node or set NODE_NAME (or use --no-publish)")
    _logging()
    inventory = NvmlInventory()
    try:
        inventory.open()
    except NvmlUnavailable as exc:
        raise UserError(str(exc), exit_code=EXIT_NO_NVML) from None
    try:
        annotator: NodeAnnotator | None = None
        if publish:
            from defrag.adapters.kube import KubeActuator, KubeError, connect

            try:
                api = connect(str(kubeconfig) if kubeconfig else None)
            except KubeError as exc:
                raise UserError(str(exc)) from None
            if once:  # one try, said at once; serving, the agent retries every --interval
                from defrag.adapters.reach import ServerUnreachable, check_reachable

                try:
                    check_reachable(api.configuration.host, "the API server",
                                    proxy=api.configuration.proxy)  # fmt: skip
                except ServerUnreachable as exc:
                    raise UserError(str(exc), ExitCode.UNREACHABLE) from None
            annotator = KubeActuator(api)
        worker = Agent(node_name or "local", inventory, annotator, interval_seconds)
        if once:
            try:
                topology = worker.sync_once()
            except Exception as exc:
                raise UserError(f"cannot publish the NVLink domains: {exc}") from None
            _print_topology(topology.to_dict(), output, inventory.driver_version())
            return
        try:
            server = HealthServer((host, port), worker.probes()).start("defrag-agent-http")
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc}") from None
        err_console.print(f"defrag agent on {node_name}: /metrics on {host}:{port}")
        keep_heap_small()
        _run_until_sigterm(worker.run)
        server.stop()
    finally:
        inventory.close()


def _run_until_sigterm(run: Callable[[threading.Event], None]) -> None:
    """``run(stop)`` on a thread of its own until SIGTERM or Ctrl-C, then ``stop`` set and the
    run's current step (one sync, bounded by the API client's timeouts) waited for."""
    sigterm = StopSignal().install()
    stop, ended = threading.Event(), threading.Event()

    def target() -> None:
        try:
            run(stop)
        finally:
            ended.set()

    worker = threading.Thread(target=target, name="defrag-agent-sync", daemon=True)
    worker.start()
    try:
        sigterm.wait(ended)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        worker.join()


def _print_topology(data: dict[str, object], output: Output, driver: str) -> None:
    data = {"driver_version": driver, **data}
    if output is not Output.table:
        print_data(data, output)
        return
    table = Table(title=f"GPUs (driver {driver})")
    for col in ("gpu", "name", "memory used / total MiB", "NVLinks", "processes"):
        table.add_column(col)
    gpus = data.get("gpus")
    for g in gpus if isinstance(gpus, list) else []:
        table.add_row(
            str(g["index"]),
            str(g["name"]),
            f"{g['memory_used_mib']} / {g['memory_total_mib']}",
            str(g["nvlinks"]),
            str(len(g["processes"])),
        )
    console.print(table)
    console.print(f"NVLink domains: {data['annotation']}")
    notes = data.get("notes")
    for note in notes if isinstance(notes, list) else []:
        console.print(f"note: {note}")
