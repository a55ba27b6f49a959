"""Where the benchmarks read the reference data (the openb trace, the FGD paper's figures):
``--data DIR``, default ``$DEFRAG_DATA_DIR``, else ``~/.cache/defrag/data``. A bench
given a directory without the files it reads stops with one line, not a traceback."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from defrag.adapters.tracedata import data_dir, missing, missing_message

__all__ = ["DEFAULT", "NODES", "missing", "missing_message", "pods", "require", "trace_files"]

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = data_dir()

NODES = "openb/openb_node_list_gpu_node.csv"


def pods(trace: str) -> str:
    """The pod list of ``trace`` (``default``, ``gpushare40``, …), relative to the data dir."""
    return f"openb/openb_pod_list_{trace}.csv"


def trace_files(traces: list[str] | tuple[str, ...]) -> list[str]:
    """The node list and the pod lists of ``traces``."""
    return [NODES, *(pods(t) for t in traces)]


def require(data: Path, names: list[str] | tuple[str, ...]) -> Path:
    """``data`` when every file of ``names`` is in it; else exit 2 with one line on stderr."""
    absent = missing(data, names)
    if absent:
        prog = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "bench"
        print(f"{prog}: {missing_message(data, absent)}", file=sys.stderr)
        raise SystemExit(2)
    return data


def add_data_option(parser: argparse.ArgumentParser) -> None:
    """The ``--data`` option every trace benchmark takes: the folder of the openb files."""
    parser.add_argument(
        "--data", type=Path, default=DEFAULT, help="$DEFRAG_DATA_DIR, else ../shared/data"
    )
