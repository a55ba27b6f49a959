"""The ``defrag`` command. Each command group lives in its own module and registers on ``app``
when imported; importing them here is what puts them on the command line."""

from __future__ import annotations

from defrag.cli import alerts as alerts  # registers `defrag alerts`
from defrag.cli import data as data  # registers `defrag data fetch`, `defrag data check`
from defrag.cli import demo as demo  # registers `defrag demo`
from defrag.cli import detect as detect  # registers `defrag detect`, `defrag rules check`
from defrag.cli import extender as extender  # registers `defrag extender` and `defrag agent`
from defrag.cli import plan as plan  # registers `defrag plan`
from defrag.cli import report as report  # registers `defrag report` and `defrag place`
from defrag.cli import run as run  # registers `defrag run`
from defrag.cli import simulate as simulate  # registers `defrag simulate`
from defrag.cli.app import app, main

__all__ = ["app", "main"]
