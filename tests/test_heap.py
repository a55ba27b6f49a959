"""The heap's freed pages go back to the kernel (defrag/adapters/heap.py)."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from defrag.adapters import heap as heap_mod
from defrag.adapters.heap import Heap, keep_heap_small
from tests.support.binaries import require_library

glibc = pytest.mark.skipif(
    Heap.glibc() is None, reason="the C library is not glibc (musl, macOS): nothing to trim"
)


def _anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@glibc
def test_a_trim_returns_pages_freed_in_the_middle_of_the_heap() -> None:
    """Pages freed below a live chunk stay resident after free(); the trim hands them back."""
    heap = Heap.glibc()
    assert heap is not None
    heap.trim()
    # Blocks of 4,000 bytes go to malloc (not Python's small-object allocator); one in 64 is kept,
    # and the last one made, so the top of the heap stays live and free() cannot shrink it.
    blocks = [bytes(4000) for _ in range(25_000)]
    kept = [*blocks[::64], blocks[-1]]
    del blocks
    before = _anon_kb()
    assert heap.trim()
    after = _anon_kb()
    freed_kb = 25_000 * 4000 // 1024 * 63 // 64
    assert before - after > freed_kb // 2, (before, after, freed_kb)
    assert len(kept) > 1


@glibc
def test_glibcs_accounting_sees_what_python_hands_to_malloc() -> None:
    """Blocks past Python's small-object size come from malloc: glibc's in-use figure grows by
    them, and by less once they are freed."""
    heap = Heap.glibc()
    assert heap is not None
    before = heap.usage_kb()
    if not before:
        pytest.skip("glibc before 2.33 has no mallinfo2")
    blocks = [bytes(4000) for _ in range(10_000)]
    grown = heap.usage_kb()
    in_blocks_kb = 10_000 * 4000 // 1024
    assert (
        grown["in_use"] + grown["mmapped"] - before["in_use"] - before["mmapped"]
        > in_blocks_kb * 0.9
    )
    del blocks
    after = heap.usage_kb()
    assert grown["in_use"] - after["in_use"] > in_blocks_kb * 0.9
    assert after["free"] + after["in_use"] <= after["heap"] + 1


@glibc
def test_the_arena_cap_is_taken() -> None:
    heap = Heap.glibc()
    assert heap is not None
    assert heap.limit_arenas(heap_mod.ARENAS)


def test_no_glibc_no_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert Heap.glibc() is None


@glibc
def test_once_per_process_with_a_trimming_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Called by every long-running command: a second call starts no second thread."""
    keep_heap_small.cache_clear()
    trims: list[int] = []

    def trim(self: Heap) -> bool:
        trims.append(1)
        return True

    monkeypatch.setattr(Heap, "trim", trim)

    def trimming() -> int:  # commands run in this process earlier started theirs
        return sum(1 for t in threading.enumerate() if t.name == "defrag-heap-trim")

    before = trimming()
    stop = keep_heap_small(0.01)
    try:
        assert stop is not None
        assert keep_heap_small(0.01) is stop
        assert trimming() == before + 1
        deadline = threading.Event()
        for _ in range(200):
            if len(trims) >= 2:
                break
            deadline.wait(0.01)
        assert len(trims) >= 2
    finally:
        assert stop is not None
        stop.set()
        keep_heap_small.cache_clear()


@glibc
@pytest.mark.parametrize("operator_set", [True, False])
def test_an_operators_malloc_arena_max_wins(
    monkeypatch: pytest.MonkeyPatch, operator_set: bool
) -> None:
    keep_heap_small.cache_clear()
    capped: list[int] = []

    def limit(self: Heap, arenas: int) -> bool:
        capped.append(arenas)
        return True

    monkeypatch.setattr(Heap, "limit_arenas", limit)
    if operator_set:
        monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    else:
        monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    stop = keep_heap_small(3600)
    try:
        assert capped == ([] if operator_set else [heap_mod.ARENAS])
    finally:
        assert stop is not None
        stop.set()
        keep_heap_small.cache_clear()


def test_the_allocators_are_named_from_the_environment_and_the_preloaded_library() -> None:
    """As the shipped Deployments run: PYTHONMALLOC=malloc over a preloaded jemalloc, which
    returns pages by itself, so no trimming thread starts; without them, pymalloc over glibc."""
    jemalloc = require_library("jemalloc")
    script = (
        "from defrag.adapters.heap import allocators, keep_heap_small; "
        "print(allocators(), keep_heap_small() is None)"
    )
    root = Path(__file__).resolve().parent.parent
    shipped = {"PYTHONMALLOC": "malloc", "LD_PRELOAD": jemalloc, "PYTHONPATH": str(root)}
    for env, said in ((shipped, "malloc+jemalloc True"), ({"PYTHONPATH": str(root)}, None)):
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        if said is not None:
            assert done.stdout.strip() == said
        else:  # this machine's own C library: glibc trims, others (musl) have nothing to do
            expected = "pymalloc+glibc False" if Heap.glibc() else "pymalloc+other True"
            assert done.stdout.strip() == expected
