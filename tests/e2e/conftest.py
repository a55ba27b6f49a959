"""Fixtures of the end-to-end suite: a real control plane per test module, the kubelet stand-in,
defrag's RBAC applied as the rendered overlay ships it.

Without the binaries (``KUBEBUILDER_ASSETS`` unset) every test here is skipped with one line
saying how to get them; with the setting pointing at an incomplete folder they fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import apply_rbac
from tests.e2e.controlplane import (
    ControlPlane,
    control_plane,
    require_assets,
)
from tests.e2e.kubelet import Kubelet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_assets()
    with control_plane(tmp_path_factory.mktemp("controlplane")) as started:
        apply_rbac(started)
        yield started


@pytest.fixture(scope="module")
def kubelet(plane: ControlPlane) -> Iterator[Kubelet]:
    stand_in = Kubelet(plane.admin).start()
    yield stand_in
    stand_in.stop()
