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
