"""A leader deposed during its cycle sends no alerts (found by the chaos soak).

The soak saw ``GPUJobStarved`` for one pod resolved by the new leader (the pod had just been
bound) and fired again half a second later by the old leader, whose cycle — begun as leader,
its execution stopped at the fence — ended by syncing the findings of its first snapshot. The
new leader's sink no longer held the alert, so it stayed firing for a finding that had cleared.
"""

from __future__ import annotations

from defrag.daemon.cycle import run_cycle
from defrag.decide import CycleConfig
from defrag.execute.fence import Tenure
from tests.test_cycle import RecordingSink, ports


class Deposed:
    """Leads when the cycle begins; the Lease is someone else's by the time it ends."""

    def still_leader(self) -> bool:
        return False

    def tenure(self) -> Tenure:
        return Tenure("old", 1)

    def holds(self, tenure: Tenure) -> bool:
        return True


def test_a_deposed_leader_sends_no_alerts() -> None:
    sink = RecordingSink()
    _, p = ports(sink)
    assert p.executor is not None
    p.executor.fence = Deposed()
    run_cycle(p, CycleConfig(), leader=True)
    assert sink.calls == []


def test_a_leader_that_still_leads_sends_them() -> None:
    sink = RecordingSink()
    _, p = ports(sink)
    run_cycle(p, CycleConfig(), leader=True)
    assert len(sink.calls) == 1
