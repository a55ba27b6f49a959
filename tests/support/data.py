"""The reference data (the openb trace, the FGD paper's figures) for the tests that need it.

The data lives outside the repository, in ``DEFRAG_DATA_DIR`` (default the user's cache,
``~/.cache/defrag/data``, where ``defrag data fetch`` puts it). A test that needs a file that
is not there skips with one line naming the file and how to get it; under ``CI=true`` (where
``.ci/run`` points ``DEFRAG_DATA_DIR`` at its copy) a missing file fails the test instead, so
CI never passes by skipping."""

from __future__ import annotations

from pathlib import Path

from defrag.adapters.tracedata import data_dir, missing, missing_message
from tests.support.binaries import unavailable

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = data_dir()


def require_data(*names: str) -> Path:
    """The data directory, when every file of ``names`` (relative to it) is there; else skip
    (fail under ``CI=true``) with one line."""
    absent = missing(SHARED_DATA, names)
    if absent:
        message = missing_message(SHARED_DATA, absent)
        unavailable(message)
    return SHARED_DATA
