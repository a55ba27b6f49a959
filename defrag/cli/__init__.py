"""The ``defrag`` command. Each command group lives in its own module and registers here."""

from __future__ import annotations

from defrag.cli.app import app, main

# Command modules register themselves on ``app`` when imported.
from defrag.cli import report as _report  # noqa: F401,E402

__all__ = ["app", "main"]
