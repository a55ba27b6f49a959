"""``defrag data``: the reference data (the openb trace) that the simulator's benchmarks and
tests read: ``fetch`` downloads and checks it, ``check`` says what is there."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from defrag.adapters.tracedata import (
    DATA_ENV,
    OPENB_URL,
    DataError,
    check,
    data_dir,
    fetch,
)
from defrag.cli.app import UserError, app, print_line, print_table
from defrag.cli.exitcodes import ExitCode

data_app = typer.Typer(
    help="The openb trace the simulator's benchmarks and tests read.", no_args_is_help=True
)
app.add_typer(data_app, name="data")

DirOpt = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help=f"The data directory (default: ${DATA_ENV}, else ~/.cache/defrag/data).",
    ),
]


@data_app.command("fetch")
def fetch_cmd(
    directory: DirOpt = None,
    source: Annotated[
        str, typer.Option("--from", help="Base URL of the openb CSV files.")
    ] = OPENB_URL,
    force: Annotated[bool, typer.Option(help="Download even the files already present.")] = False,
) -> None:
    """Download the openb trace files into DIR/openb, each checked against its SHA-256."""
    dest = directory or data_dir()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        flag = "--dir" if directory else f"the data directory (${DATA_ENV} or the default)"
        raise UserError(f"{flag} {dest}: cannot create: {exc.strerror or exc}") from None
    try:
        done = fetch(dest, source, force=force)
    except DataError as exc:
        code = ExitCode.UNREACHABLE if exc.unreachable else ExitCode.BAD_INPUT
        raise UserError(str(exc), code) from None
    fetched = sum(1 for _, how in done if how == "fetched")
    print_line(f"{dest}: {fetched} fetched, {len(done) - fetched} already present and verified")


@data_app.command("check")
def check_cmd(directory: DirOpt = None) -> None:
    """Which reference files are present, missing or altered (exit 1 unless all are present)."""
    dest = directory or data_dir()
    if not dest.is_dir():
        where = "--dir" if directory else f"the data directory (${DATA_ENV} or the default)"
        raise UserError(
            f"{where} {dest}: no such folder (`defrag data fetch --dir {dest}` fills it)"
        )
    states = check(dest)
    table = Table("file", "state", title=str(dest))
    for state in states:
        table.add_row(state.name, state.state)
    print_table(table)
    if any(s.state != "ok" for s in states):
        raise typer.Exit(1)
