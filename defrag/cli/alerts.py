"""``defrag alerts test``: send a test alert to Alertmanager, then resolve it.

Also the Alertmanager options other commands share (``defrag detect --alertmanager URL``):
import the ``*Opt`` annotations and build the sink with :func:`make_sink`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from defrag.cli.app import (
    Output,
    OutputOpt,
    UserError,
    app,
    console,
    parse_duration,
    print_data,
    print_table,
)
from defrag.cli.exitcodes import ExitCode

if TYPE_CHECKING:  # imported when a command runs: the sink pulls in the detectors (scipy)
    from defrag.adapters.alertmanager import AlertmanagerSink, SendResult

alerts_app = typer.Typer(help="Alerts sent to Alertmanager.", no_args_is_help=True)
app.add_typer(alerts_app, name="alerts")


AlertmanagerOpt = Annotated[
    list[str],
    typer.Option(
        "--alertmanager",
        help="Alertmanager base URL, e.g. http://alertmanager:9093 (repeat for an HA pair).",
    ),
]
ClusterLabelOpt = Annotated[
    str | None,
    typer.Option("--cluster-label", help="Value of the `cluster` label on every alert (default)."),
]
OldClusterLabelOpt = Annotated[
    str | None,
    typer.Option("--cluster", hidden=True, help="Deprecated: --cluster-label."),
]
"""``--cluster`` was the alert label's flag in ``detect`` and ``alerts test``; it means the
cluster to run against in ``run``, so the label has its own name. The old one still works, with
one warning line."""


def cluster_label(label: str | None, old: str | None) -> str:
    """The ``cluster`` label from ``--cluster-label`` (or the deprecated ``--cluster``)."""
    if old is not None:
        if label is not None:
            raise UserError("--cluster is the old name of --cluster-label: give one of them")
        print(
            "warning: --cluster (the alert label) is deprecated here; use --cluster-label",
            file=sys.stderr,
        )
        return old
    return label if label is not None else "default"


BearerTokenFileOpt = Annotated[
    Path | None,
    typer.Option("--am-bearer-token-file", help="File holding a bearer token for Alertmanager."),
]
BasicAuthOpt = Annotated[
    str | None,
    typer.Option(
        "--am-basic-auth",
        envvar="DEFRAG_AM_BASIC_AUTH",
        help="user:password for Alertmanager (or the DEFRAG_AM_BASIC_AUTH variable).",
    ),
]
CaFileOpt = Annotated[
    Path | None, typer.Option("--am-ca-file", help="CA bundle to verify Alertmanager's TLS.")
]
InsecureOpt = Annotated[
    bool, typer.Option("--am-insecure", help="Do not verify Alertmanager's TLS certificate.")
]


def make_sink(
    urls: list[str],
    *,
    cluster: str = "default",
    bearer_token_file: Path | None = None,
    basic_auth: str | None = None,
    ca_file: Path | None = None,
    insecure: bool = False,
    timeout_s: float = 5.0,
    retry_attempts: int = 3,
    retry_wait_s: float = 0.5,
) -> AlertmanagerSink:
    """An AlertmanagerSink from command-line options; a bad option is a UserError."""
    from defrag.adapters.alertmanager import AlertmanagerSink

    auth: tuple[str, str] | None = None
    if basic_auth is not None:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise UserError("--am-basic-auth: expected user:password")
        auth = (user, password)
    if bearer_token_file is not None and not bearer_token_file.is_file():
        raise UserError(f"--am-bearer-token-file {bearer_token_file}: no such file")
    try:
        sink = AlertmanagerSink(
            urls,
            cluster=cluster,
            bearer_token_file=bearer_token_file,
            basic_auth=auth,
            ca_file=ca_file,
            verify_tls=not insecure,
            timeout_s=timeout_s,
            retry_attempts=retry_attempts,
            retry_wait_s=retry_wait_s,
        )
    except ValueError as exc:
        raise UserError(f"--alertmanager: {exc}") from exc
    sink.probe()  # one that is not there fails at once, not after every retry
    return sink


@alerts_app.command("test")
def test_alert(
    alertmanager: AlertmanagerOpt,
    label: ClusterLabelOpt = None,
    old_label: OldClusterLabelOpt = None,
    hold: Annotated[
        str,
        typer.Option(
            "--hold",
            help="How long the test alert stays firing before it is resolved (90s, 2m; bare: "
            "seconds). Alertmanager notifies only after the route's group_wait (30s by "
            "default), so hold longer than that to see the notification; 0 checks only that "
            "the alert is accepted.",
        ),
    ] = "60s",
    bearer_token_file: BearerTokenFileOpt = None,
    basic_auth: BasicAuthOpt = None,
    ca_file: CaFileOpt = None,
    insecure: InsecureOpt = False,
    timeout: Annotated[
        str, typer.Option("--timeout", help="Per request (5s; bare: seconds).")
    ] = "5s",
    output: OutputOpt = Output.table,
) -> None:
    """Send a test alert (DefragTestAlert, severity info) to every Alertmanager, hold it
    firing, then resolve it. Exits non-zero if any Alertmanager did not take it."""
    if not alertmanager:
        raise UserError("--alertmanager: give at least one URL")
    cluster = cluster_label(label, old_label)
    hold_s = parse_duration(hold, "--hold")
    timeout_s = parse_duration(timeout, "--timeout")
    # The table below reports each failure; the sink's own error log would only repeat it.
    logging.getLogger("defrag.adapters.alertmanager").setLevel(logging.CRITICAL)
    sink = make_sink(
        alertmanager,
        cluster=cluster,
        bearer_token_file=bearer_token_file,
        basic_auth=basic_auth,
        ca_file=ca_file,
        insecure=insecure,
        timeout_s=timeout_s,
        retry_attempts=2,
        retry_wait_s=0.5,
    )
    start = datetime.now(UTC)
    alert = sink.template.test_alert(start)
    # If this process dies while holding, the alert lapses by itself a minute later.
    fired = sink.send([(alert, start + timedelta(seconds=hold_s + 60))], start)
    if any(r.outcome == "ok" for r in fired) and hold_s > 0:
        if output is Output.table:
            console.print(f"test alert firing; resolving it in {hold_s:g} s (Ctrl-C: now)")
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C resolves at once
            time.sleep(hold_s)
    end = datetime.now(UTC)
    resolved = sink.send([(alert, end)], end)
    rows = [
        {"url": f.url, "fired": f.outcome == "ok", "resolved": r.outcome == "ok", "reason": why}
        for f, r in zip(fired, resolved, strict=True)
        for why in [_reason(f, r)]
    ]
    if output is not Output.table:
        print_data({"alert": dict(alert.labels), "results": rows}, output)
    else:
        table = Table(title=f"{alert.name} (cluster {cluster})")
        for column in ("alertmanager", "fired", "resolved", "reason"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                str(row["url"]), _mark(row["fired"]), _mark(row["resolved"]), str(row["reason"])
            )
        print_table(table)
    failed = [row for row in rows if row["reason"]]
    if failed:
        detail = "; ".join(f"{row['url']}: {row['reason']}" for row in failed)
        # none reached (the sink's "cannot connect"): a server problem, not an answer
        unreached = all("cannot connect" in str(row["reason"]) for row in failed)
        raise UserError(
            f"test alert not delivered to every Alertmanager ({detail})",
            ExitCode.UNREACHABLE if unreached else ExitCode.NO,
        )


def _reason(fired: SendResult, resolved: SendResult) -> str:
    if fired.reason:
        return f"firing: {fired.reason}"
    if resolved.reason:
        return f"resolving: {resolved.reason}"
    return ""


def _mark(ok: object) -> str:
    return "yes" if ok else "no"
