"""``defrag extender`` (the kube-scheduler extender) and ``defrag agent`` (the node agent)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from defrag.cli.app import (
    Output,
    OutputOpt,
    UserError,
    app,
    console,
    err_console,
    print_data,
)
from defrag.cli.profile import PolicyOpt, SettingsOpt, profile_config

if TYPE_CHECKING:
    from defrag.extender.server import ExtenderHTTPServer

HostOpt = Annotated[str, typer.Option(help="Address to bind.")]
KubeconfigOpt = Annotated[
    Path | None, typer.Option(help="Kubeconfig (default: in-cluster, else ~/.kube/config).")
]


def _on_sigterm(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def _logging() -> None:
    logging.basicConfig(
        level=os.environ.get("DEFRAG_LOGGING__LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@app.command()
def extender(
    port: Annotated[int, typer.Option(help="Port to serve /filter and /prioritize on.")] = 8888,
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
    relist_interval_s: Annotated[
        float,
        typer.Option(help="Seconds between rereads of --snapshot files (the API is watched)."),
    ] = 10.0,
    max_staleness_s: Annotated[
        float, typer.Option(help="/readyz fails when the state is older than this.")
    ] = 120.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Also serve GET /metrics, /healthz and /readyz (nothing else) on this port, for "
            "probes and Prometheus when --host is a loopback address.",
            min=1,
            max=65535,
        ),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address to bind --metrics-port.")] = (
        "0.0.0.0"
    ),
    kubeconfig: KubeconfigOpt = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="PEM certificate: serve HTTPS (kube-scheduler's enableHTTPS)."),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    max_connections: Annotated[
        int, typer.Option(help="Connections served at once; more get 503 and are closed.")
    ] = 64,
    idle_timeout_s: Annotated[
        float, typer.Option(help="Close a keep-alive connection idle this long.")
    ] = 30.0,
    read_timeout_s: Annotated[
        float, typer.Option(help="A request's headers and body must arrive within this.")
    ] = 10.0,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize) with defrag's score function."""
    import ssl

    from defrag.adapters.httpserve import ServerLimits
    from defrag.adapters.sources import SourceError, SourceSpec, open_source
    from defrag.extender.server import serve, serve_status, stop, tls_context

    config = profile_config(settings_file, policy)
    if relist_interval_s <= 0 or max_staleness_s <= 0:
        raise UserError("--relist-interval-s and --max-staleness-s must be positive")
    if max_connections < 1 or not 0 < idle_timeout_s < 1e6 or not 0 < read_timeout_s < 1e6:
        raise UserError(
            "--max-connections, --idle-timeout-s and --read-timeout-s must be positive and finite"
        )
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
    # A bad snapshot file is the user's mistake: said now (the factory reads it), not at /readyz.
    # The live API is watched (a freed node is seen at once); snapshot files are re-read.
    spec = (
        SourceSpec(tuple(snapshot))
        if snapshot
        else SourceSpec(live=True, kubeconfig=kubeconfig, watch=True)
    )
    try:
        source = open_source(spec).source
    except SourceError as exc:
        raise UserError(str(exc)) from None
    try:
        server = serve(
            source,
            profile=config,
            host=host,
            port=port,
            relist_interval_s=relist_interval_s,
            max_staleness_s=max_staleness_s,
            limits=ServerLimits(max_connections, idle_timeout_s, read_timeout_s),
            tls=tls,
        )
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc}") from None
    servers = [server]
    if metrics_port is not None:
        try:
            servers.append(serve_status(server, metrics_host, metrics_port))
        except OSError as exc:
            stop(server)
            raise UserError(f"cannot listen on {metrics_host}:{metrics_port}: {exc}") from None
    stopping = threading.Event()
    _on_sigterm(stopping)
    for srv in servers:
        threading.Thread(target=srv.serve_forever, args=(0.2,), daemon=True).start()
    err_console.print(f"defrag extender: policy {config.policy}, serving on {server.url}")
    if len(servers) > 1:
        err_console.print(f"defrag extender: /metrics, /healthz, /readyz on {servers[1].url}")
    try:
        while not stopping.wait(0.5):
            pass
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
    port: Annotated[int, typer.Option(help="Port for /metrics and /healthz.")] = 9410,
    host: HostOpt = "0.0.0.0",
    interval_s: Annotated[
        float, typer.Option(help="Seconds between topology checks (published on change).")
    ] = 300.0,
    once: Annotated[
        bool, typer.Option("--once", help="Read the GPUs once, publish, print, exit.")
    ] = False,
    publish: Annotated[
        bool, typer.Option(help="Patch the node annotation (--no-publish: only read and print).")
    ] = True,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """The node agent: NVLink domains → node annotation; GPU memory on /metrics.

    Exits 3 when NVML (the NVIDIA driver) is not available on this machine.
    """
    from defrag.adapters.health import HealthServer
    from defrag.adapters.nvml import NvmlInventory, NvmlUnavailable
    from defrag.agent.service import EXIT_NO_NVML, Agent, NodeAnnotator

    node_name = node or os.environ.get("NODE_NAME") or ""
    if publish and not node_name:
        raise UserError("no node name: pass --node or set NODE_NAME (or use --no-publish)")
    if interval_s <= 0:
        raise UserError("--interval-s must be positive")
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
                annotator = KubeActuator(connect(str(kubeconfig) if kubeconfig else None))
            except KubeError as exc:
                raise UserError(str(exc)) from None
        worker = Agent(node_name or "local", inventory, annotator, interval_s)
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
        stopping = threading.Event()
        _on_sigterm(stopping)
        err_console.print(f"defrag agent on {node_name}: /metrics on {host}:{port}")
        try:
            worker.run(stopping)
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
    finally:
        inventory.close()


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
