"""The ``defrag`` command. Each command group lives in its own module and registers on ``app``
when imported; importing them here is what puts them on the command line."""

from __future__ import annotations

from defrag.cli import alerts as alerts  # registers `defrag alerts`
from defrag.cli import report
from defrag.cli.app import app, main

__all__ = ["app", "main", "report"]
