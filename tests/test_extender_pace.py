"""The extender's switch interval while it serves, and the one before restored after."""

from __future__ import annotations

import sys

import pytest

from defrag.extender.pace import SWITCH_INTERVAL_S, serving_pace


def test_the_interval_is_the_extenders_while_serving_and_restored_after_a_failure() -> None:
    before = sys.getswitchinterval()
    assert before != pytest.approx(SWITCH_INTERVAL_S)  # else the test could not tell
    with pytest.raises(RuntimeError), serving_pace():
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        raise RuntimeError("the server stopped")
    assert sys.getswitchinterval() == before
