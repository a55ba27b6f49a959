"""The Typer application and the shared error type of every command."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console

from defrag.model.cluster import Cluster

try:  # typer ≥ 0.20 carries its own copy of click and only catches that copy's exceptions
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover - older typer on plain click
    from click import ClickException as _ClickException  # type: ignore[assignment]

app = typer.Typer(
    name="defrag",
    help="Keeps GPU Kubernetes clusters unfragmented.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain errors: one line on stderr, never wrapped into a box
)
console = Console()
err_console = Console(stderr=True)


class Output(StrEnum):
    """``--output``: a rich table for people, or JSON for scripts."""

    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
SnapshotOpt = Annotated[
    list[Path],
    typer.Option(
        "--snapshot",
        "-s",
        help="JSON/YAML of `kubectl get nodes,pods,pdb -A -o json` (repeatable).",
    ),
]
StrictOpt = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="An object defrag cannot read is an error (exit 2), not a warning and left out.",
    ),
]


class UserError(_ClickException):
    """A user's mistake (bad file, bad flag, unreachable server): one clear line, no traceback.

    Click prints ``Error: <message>`` to stderr and exits with ``exit_code`` (2 by default).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        print(f"error: {self.format_message()}", file=file or sys.stderr)


def print_json(data: Any, stream: IO[str] | None = None) -> None:
    """Machine-readable output: plain JSON on stdout, no colour or wrapping."""
    out = stream or sys.stdout
    json.dump(data, out, indent=2, sort_keys=False, default=str)
    out.write("\n")


def load_cluster(paths: Sequence[Path], strict: bool = False) -> Cluster:
    """Read snapshot files; a file that cannot be read (or, ``strict``, any object that cannot)
    becomes a UserError naming file and field; objects left out are said on stderr."""
    from defrag.adapters.kube_convert import ConversionError
    from defrag.adapters.snapshot import SnapshotError, load_snapshot
    from defrag.model.cluster import ModelError

    if not paths:
        raise UserError("no snapshot given (--snapshot FILE)")
    try:
        cluster = load_snapshot(list(paths), strict=strict)
    except (SnapshotError, ConversionError, ModelError, OSError) as exc:
        raise UserError(str(exc)) from None
    say_warnings(cluster)
    return cluster


def say_warnings(cluster: Cluster) -> None:
    """One ``warning:`` line on stderr per object the source could not model fully."""
    for warning in cluster.warnings:
        print(f"warning: {warning}", file=sys.stderr)


def main() -> None:
    """Console-script entry point."""
    app()
