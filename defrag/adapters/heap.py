"""Handing freed heap memory back to the kernel, on glibc.

A long-running Python process that decodes watch events and API lists on several threads, and
builds and drops arrays every cycle, frees most of what it allocates, yet its resident size keeps
creeping up. The objects are gone; the pages are not. glibc gives each thread that contends for
the heap an arena of its own (up to eight per core of the *node*, not of the container's CPU
limit), and it returns a freed page to the kernel only from the top of an arena, so pages freed
in the middle of an arena stay resident until the same arena reuses them. Two measures bound
that:

- fewer arenas (``mallopt(M_ARENA_MAX)``), so freed pages are reused by the next burst instead of
  sitting in an arena no thread comes back to; an operator's ``MALLOC_ARENA_MAX`` wins;
- ``malloc_trim(0)`` every :data:`TRIM_EVERY_S`, which releases every whole free page of every
  arena (``madvise(MADV_DONTNEED)``), not only the top.

Elsewhere than glibc (musl, macOS) both are skipped: :meth:`Heap.glibc` returns None.

That bounds glibc's part. CPython's own small-object allocator (pymalloc) is the other part: it
carves objects of up to 512 bytes out of 1 MiB arenas and hands an arena back only when every
object in it is gone, so a few long-lived objects made during a burst keep whole arenas
resident; no trim reaches them. An operator may run another allocator instead
(``PYTHONMALLOC=malloc`` over a preloaded jemalloc, say); :func:`allocators` says which pair a
process runs (``defrag_build_info{allocator}``), and with a C allocator other than glibc nothing
here is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

ARENAS = 2
"""Arenas a defrag process keeps: its hot paths run on one or two threads at a time."""

TRIM_EVERY_S = 60.0
"""Seconds between two trims: a trim walks every arena's free lists under its lock, a few
milliseconds on a heap of a gigabyte, so once a minute costs nothing a cycle would notice."""

_M_ARENA_MAX = -8  # from glibc's malloc.h


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc 2.33 on): ten ``size_t`` fields."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


@dataclass(frozen=True)
class Heap:
    """glibc's allocator, reached through ctypes."""

    libc: ctypes.CDLL

    @classmethod
    def glibc(cls) -> Heap | None:
        """The process's C library when it is glibc (it has ``malloc_trim``), else None."""
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        try:
            libc = ctypes.CDLL(name)
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
            libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            return None
        return cls(libc)

    def limit_arenas(self, arenas: int) -> bool:
        """At most ``arenas`` arenas from now on (those already made stay); True when set."""
        return bool(self.libc.mallopt(_M_ARENA_MAX, arenas))

    def usage_kb(self) -> dict[str, int]:
        """What glibc holds, in kB: ``heap`` (obtained by sbrk and the arenas), ``mmapped``
        (blocks mapped on their own), ``in_use`` and ``free`` (allocated and free chunks of the
        heap). The free part is what a trim may still hand back, page by page. Empty before
        glibc 2.33 (no ``mallinfo2``)."""
        try:
            call = self.libc.mallinfo2
        except AttributeError:
            return {}
        call.restype = _Mallinfo2
        info = call()
        return {
            "heap": info.arena // 1024,
            "mmapped": info.hblkhd // 1024,
            "in_use": info.uordblks // 1024,
            "free": info.fordblks // 1024,
        }

    def trim(self) -> bool:
        """Return every whole free page to the kernel; True when any was returned."""
        return bool(self.libc.malloc_trim(0))


@dataclass(frozen=True)
class Allocators:
    """Which allocators serve this process: Python's (``pymalloc``, or ``malloc`` when
    ``PYTHONMALLOC`` hands every object to the C allocator) and the C library's (``glibc``,
    ``jemalloc`` or ``mimalloc`` when one is preloaded, else ``other``)."""

    python: str
    c: str

    def __str__(self) -> str:
        return f"{self.python}+{self.c}"


_C_ALLOCATORS = (("jemalloc", "mallctl"), ("mimalloc", "mi_malloc"), ("glibc", "malloc_trim"))
"""A symbol only that allocator exports, looked up in the process's global namespace (a
preloaded library's symbols come first): the first found names it."""


def allocators(environ: Mapping[str, str] | None = None) -> Allocators:
    """The allocators this process runs with (``PYTHONMALLOC`` as the interpreter read it at
    start: the ``_debug`` variants are the same allocators with checks)."""
    env = os.environ if environ is None else environ
    python = "malloc" if env.get("PYTHONMALLOC", "").startswith("malloc") else "pymalloc"
    try:
        process = ctypes.CDLL(None)
    except OSError:
        return Allocators(python, "other")
    c = next((name for name, symbol in _C_ALLOCATORS if hasattr(process, symbol)), "other")
    return Allocators(python, c)


@functools.cache
def keep_heap_small(every_s: float = TRIM_EVERY_S) -> threading.Event | None:
    """At a process's start, before its threads: cap the arenas (unless ``MALLOC_ARENA_MAX`` is
    set) and trim every ``every_s`` on a daemon thread. Once per process (a command called again
    in the same process, as tests do, gets the first call's event). The event returned stops the
    trimming; None when the C library is not glibc, or another allocator (jemalloc) was preloaded
    over it: that one hands pages back by itself."""
    heap = Heap.glibc()
    if heap is None or allocators().c != "glibc":
        return None
    if "MALLOC_ARENA_MAX" not in os.environ and not heap.limit_arenas(ARENAS):
        log.debug("mallopt(M_ARENA_MAX, %d) refused", ARENAS)
    stop = threading.Event()

    def trim() -> None:
        while not stop.wait(every_s):
            heap.trim()

    threading.Thread(target=trim, name="defrag-heap-trim", daemon=True).start()
    return stop
