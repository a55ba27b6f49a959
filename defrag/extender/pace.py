"""How soon a request thread gets the interpreter back.

kube-scheduler waits for the extender's two answers per pod on its serial path, so what it pays
is their wall time, not their CPU. An answer's thread gives up the interpreter lock at each
socket read and write; when the view's builder or the watch thread is running Python code then,
the answer waits until that thread is asked to let go, which CPython does only after the switch
interval (5 ms by default) — several times an answer's own CPU. A shorter interval lets the
answer back in sooner; the builder and the watch loop pay a few more hand-offs, each a few
microseconds, and only while an answer is waiting.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

SWITCH_INTERVAL_S = 0.0005
"""The extender process's ``sys.setswitchinterval``."""


@contextlib.contextmanager
def serving_pace() -> Iterator[None]:
    """The extender's switch interval while the block serves; the one before, after it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


__all__ = ["SWITCH_INTERVAL_S", "serving_pace"]
