"""Execution windows: cron expressions with a length, optionally gated by an idle finding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from apscheduler.triggers.cron import CronTrigger

from defrag.model.utc import utc

DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def crontab_trigger(expr: str, timezone: str = "UTC") -> CronTrigger:
    """A CronTrigger for a five-field crontab line, with crontab's day-of-week numbering.

    APScheduler 3 counts days of the week from Monday = 0, crontab from Sunday = 0 (7 is
    Sunday too): ``1-5`` must mean Monday to Friday, so numeric days become names first.
    """
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields (minute hour day month weekday), got {len(fields)}")
    minute, hour, day, month, weekday = fields
    return CronTrigger(
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=_weekday_names(weekday),
        timezone=timezone,
    )


def _weekday_names(field: str) -> str:
    parts = []
    for token in field.split(","):
        base, _, step_text = token.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*" and step == 1:
            parts.append("*")
            continue
        if base == "*":
            lo, hi = 0, 6
        elif base.replace("-", "").isdigit():
            lo_text, _, hi_text = base.partition("-")
            lo = int(lo_text)
            hi = int(hi_text) if hi_text else (6 if step_text else lo)
        else:
            parts.append(token)  # names: APScheduler reads them as crontab does
            continue
        if not (0 <= lo <= 7 and 0 <= hi <= 7 and lo <= hi and step >= 1):
            raise ValueError(f"day of week {token!r} out of range 0-7")
        parts += [DAY_NAMES[d % 7] for d in range(lo, hi + 1, step)]
    return ",".join(dict.fromkeys(parts))


@dataclass(frozen=True, slots=True)
class Window:
    """Opens at every fire time of ``cron`` (five crontab fields) and stays open ``length_s``."""

    cron: str
    length_s: float
    timezone: str = "UTC"

    def trigger(self) -> CronTrigger:
        return crontab_trigger(self.cron, self.timezone)

    def opening(self, now: datetime) -> datetime | None:
        """The start of the window holding ``now``, or None when ``now`` is outside it.

        The earliest fire time in ``(now - length, now]``: CronTrigger's next fire time is
        inclusive, so asking from ``now - length`` finds it. (A window longer than its cron
        period merges with the next; the earliest start names the merged window.)
        """
        earliest = now - timedelta(seconds=self.length_s)
        start = self.trigger().get_next_fire_time(None, earliest + timedelta(microseconds=1))
        if start is not None and start <= now:
            return start
        return None

    def next_opening(self, now: datetime) -> datetime | None:
        return self.trigger().get_next_fire_time(None, now)


@dataclass(frozen=True, slots=True)
class WindowStatus:
    """Whether execution may happen now, and why (or why not)."""

    open: bool
    reason: str
    start: datetime | None = None
    end: datetime | None = None
    next_open: datetime | None = None
    budget_key: str = ""
    """Overrides :attr:`key` (make-room-now outside the windows counts its budgets per day)."""

    @property
    def key(self) -> str:
        """Names this window's opening: budgets are counted per key."""
        if self.budget_key:
            return self.budget_key
        return self.start.isoformat() if self.start else ""

    def to_dict(self) -> dict[str, object]:
        return {
            "open": self.open,
            "reason": self.reason,
            "start": self.start.isoformat() if self.start else None,
            "end": self.end.isoformat() if self.end else None,
            "next_open": self.next_open.isoformat() if self.next_open else None,
            "budget_key": self.budget_key or None,
        }


def window_status(
    windows: Sequence[Window], now: datetime, *, idle: bool | None = None
) -> WindowStatus:
    """The status at ``now``. ``idle``: None = no idle gate; else whether the cluster is idle."""
    now = utc(now)
    if not windows:
        return WindowStatus(False, "no execution window configured")
    for window in windows:
        start = window.opening(now)
        if start is None:
            continue
        end = start + timedelta(seconds=window.length_s)
        if idle is False:
            return WindowStatus(
                False,
                f"window {window.cron!r} open but the cluster is not idle (idle gate)",
                start,
                end,
            )
        gate = " and the cluster is idle" if idle else ""
        return WindowStatus(
            True, f"window {window.cron!r} open until {end.isoformat()}{gate}", start, end
        )
    upcoming = [t for t in (w.next_opening(now) for w in windows) if t is not None]
    nxt = min(upcoming) if upcoming else None
    when = f"; next opens {nxt.isoformat()}" if nxt else ""
    return WindowStatus(False, f"outside every execution window{when}", next_open=nxt)


EARLY_PREFIX = "backlog/"
EARLY_KEY = EARLY_PREFIX + "{day}"
"""Early windows share one set of per-window budgets per UTC day."""


@dataclass(frozen=True, slots=True)
class EarlyWindows:
    """A window opened ahead of the schedule when the starved pods' backlog piles up.

    At the start of every period (``every_s`` from midnight UTC) a cycle within ``check_s``
    of it may open one when the backlog (the starved pods' GPUs × hours pending) is at least
    ``backlog_gpu_h``; it stays open ``length_s``. All early windows of a UTC day spend one
    window's budgets (:data:`EARLY_KEY`): the operator's limits hold however often they open.
    Checked at the periods' starts only, so the cycles between them change nothing (the
    simulator need not run them)."""

    backlog_gpu_h: float
    every_s: float = 3600.0
    length_s: float = 3600.0
    check_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backlog_gpu_h < 0 or self.every_s <= 0 or self.length_s <= 0 or self.check_s <= 0:
            raise ValueError("early windows: backlog >= 0, period, length and check > 0")

    def period_start(self, now: datetime) -> datetime:
        now = utc(now)
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        periods = (now - midnight).total_seconds() // self.every_s
        return midnight + timedelta(seconds=periods * self.every_s)

    def open_since(self, now: datetime, opened: datetime | None) -> bool:
        return opened is not None and opened <= utc(now) < opened + timedelta(seconds=self.length_s)

    def may_open(self, now: datetime, opened: datetime | None) -> bool:
        """Whether a cycle at ``now`` could be in an early window (open, or its check)."""
        start = self.period_start(now)
        return self.open_since(now, opened) or (utc(now) - start).total_seconds() < self.check_s

    def status(
        self, closed: WindowStatus, now: datetime, backlog: float, opened: datetime | None
    ) -> WindowStatus:
        """The early window at ``now`` (``opened``: the start of one an earlier cycle opened),
        else ``closed``."""
        start = opened if self.open_since(now, opened) else None
        if start is None and self.may_open(now, None) and backlog >= self.backlog_gpu_h > 0:
            start = self.period_start(now)
        if start is None:
            return closed
        end = start + timedelta(seconds=self.length_s)
        return WindowStatus(
            True,
            f"{closed.reason}; opened early until {end.isoformat()}: the starved pods' backlog "
            f"({backlog:.1f} GPU-hours) reached windows.open_early_backlog_gpu_h "
            f"({self.backlog_gpu_h:g})",
            start,
            end,
            closed.next_open,
            EARLY_KEY.format(day=start.date().isoformat()),
        )

    @staticmethod
    def opened(window: WindowStatus) -> datetime | None:
        """The start of ``window`` when it is an early one (the next cycle's ``opened``)."""
        early = window.open and window.budget_key.startswith(EARLY_PREFIX)
        return window.start if early else None
