"""Shared fixtures: the reference data directory (see tests/support/data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.data import require_data


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The data directory with the openb node list and default trace in it (else a skip)."""
    return require_data("openb/openb_node_list_gpu_node.csv", "openb/openb_pod_list_default.csv")
