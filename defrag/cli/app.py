"""The Typer application and the shared error type of every command."""

from __future__ import annotations

import json
import sys
from typing import IO, Any

import click
import typer
from rich.console import Console

app = typer.Typer(
    name="defrag",
    help="Keeps GPU Kubernetes clusters unfragmented.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


class UserError(click.ClickException):
    """A user's mistake (bad file, bad flag, unreachable server): one clear line, no traceback.

    Click prints ``Error: <message>`` to stderr and exits with ``exit_code`` (2 by default).
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def print_json(data: Any, stream: IO[str] | None = None) -> None:
    """Machine-readable output: plain JSON on stdout, no colour or wrapping."""
    out = stream or sys.stdout
    json.dump(data, out, indent=2, sort_keys=False, default=str)
    out.write("\n")


def main() -> None:
    """Console-script entry point."""
    app()
