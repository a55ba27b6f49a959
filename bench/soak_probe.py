"""Runs the ``defrag`` command line with a thread that counts the live objects by type.

    python -m bench.soak_probe run --kubeconfig ... (the arguments of ``defrag``)

The long soak (``bench/bench_soak.py --memory``) starts its daemons and the extender through
this, so that when RSS grows the growth can be named: every ``SOAK_PROBE_EVERY_S``
seconds (600 by default) one JSON line is appended to ``SOAK_PROBE_FILE`` with the time,
the interpreter's garbage collector counts and the number of live objects of each type (the
60 most numerous); with ``SOAK_PROBE_TRACE=Node,Pod`` also, for the name with the most
live instances of each type, the chain of objects that hold them (referrers, up to 8 levels);
``SOAK_PROBE_GC_OFF=1`` starts the process with the cyclic collector off (a diagnosis: what
reference cycles keep when nothing collects them). Every line also has the blocks the
interpreter's allocator holds (``sys.getallocatedblocks``: strings, bytes and numbers too, which
the type counts leave out, as the collector does not track them), what pymalloc's arenas span
and what glibc's heap holds (in use and free), so that growth of RSS with flat objects can be
told apart: arenas kept by a few live blocks, or glibc's free chunks no trim can hand back. With
``SOAK_PROBE_TRACEMALLOC=N`` the process is traced by :mod:`tracemalloc` (N frames per
allocation; it runs slower and larger; ``SOAK_PROBE_TRACEMALLOC_COMMANDS=run`` traces the
daemons only) from the first probe after ``SOAK_PROBE_BASELINE_S`` (default 900 s, the soak's
warm-up; traced from the start, a daemon's imports alone outlast the soak's start-up bound), and
each later line names the allocation sites whose live memory grew most since the probe after
that: when RSS grows and no type's count does, what holds the memory. With
``SOAK_PROBE_PEAKS_FILE`` a second thread writes there a line each time the allocated blocks
reach a new high (:func:`watch_peaks`), naming what every thread is running at that moment.
Nothing is collected or freed by the probe: it only counts, so the daemon
behaves as it would without it (the count holds the GIL for a moment, ~0.1–1 s at a few
hundred MB of heap).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from defrag.adapters.heap import Heap


@contextlib.contextmanager
def world_stopped() -> Iterator[None]:
    """No other thread runs until the block ends: ``gc.get_objects()`` hands out tuples that
    another thread is still building (``tuple(generator)`` grows its tuple in place, which it
    may do only while it holds the one reference). Held by the probe's list when that thread
    resumes, the next growth fails with ``SystemError: Objects/tupleobject.c: bad argument to
    internal function`` (python/cpython#39117): a daemon cycle failed by the probe itself. So
    the probe keeps the GIL, by a switch interval longer than the count, until it has let
    every object go."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def count_types() -> dict[str, int]:
    with world_stopped():
        counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    return dict(counts.most_common(60))


def describe(obj: object) -> str:
    """A short name for a referrer: its type, and for an instance's ``__dict__`` or a bound
    method whose it is."""
    kind = type(obj).__qualname__
    if isinstance(obj, dict):
        for owner in gc.get_referrers(obj):
            if getattr(owner, "__dict__", None) is obj:
                return f"{type(owner).__module__}.{type(owner).__qualname__}.__dict__"
        return f"dict({len(obj)} keys)"
    if isinstance(obj, (list, tuple, set, frozenset)):
        return f"{kind}({len(obj)})"
    if inspect.isframe(obj):
        where = f"{Path(obj.f_code.co_filename).name}:{obj.f_lineno}"
        return f"frame {obj.f_code.co_qualname} ({where})"
    return f"{type(obj).__module__}.{kind}"


def holders(kind: str, chains: int = 3, depth: int = 8) -> dict[str, object]:
    """Which objects hold the live instances of ``kind``: for the ``name`` with the most
    instances, a chain of referrers (each the first that is not the probe's own list or
    frame) from up to ``chains`` of them."""
    objs = [o for o in gc.get_objects() if type(o).__qualname__ == kind]
    names = Counter(str(getattr(o, "name", "?")) for o in objs)
    if not names:
        return {}
    name, copies = names.most_common(1)[0]
    picked = [o for o in objs if str(getattr(o, "name", "?")) == name][:chains]
    del objs
    out: list[list[str]] = []
    mine = {id(picked), id(out)}  # the probe's own containers refer to what it walks
    for obj in picked:
        chain: list[str] = []
        current: object = obj
        mine.add(id(chain))
        seen = set(mine)
        for _ in range(depth):
            found = gc.get_referrers(current)
            mine.add(id(found))
            refs = [r for r in found if id(r) not in seen and id(r) not in mine]
            refs = [r for r in refs if not (inspect.isframe(r) and r.f_code in _PROBE_CODE)]
            mine.add(id(refs))
            del found
            if not refs:
                break
            current = refs[0]
            seen.add(id(current))
            chain.append(describe(current))
        out.append(chain)
    return {"name": name, "copies": copies, "instances": sum(names.values()), "chains": out}


def grown_sites(now: tracemalloc.Snapshot, base: tracemalloc.Snapshot, top: int = 15) -> list[Any]:
    """The allocation sites (their innermost frames) whose live bytes grew most since ``base``."""
    stats = now.compare_to(base, "traceback")
    stats.sort(key=lambda st: st.size_diff, reverse=True)
    return [
        {
            "kb": round(st.size_diff / 1024, 1),
            "blocks": st.count_diff,
            "at": [f"{Path(f.filename).name}:{f.lineno}" for f in list(st.traceback)[-8:]],
        }
        for st in stats[:top]
        if st.size_diff > 0
    ]


def resident_kb() -> dict[str, int]:
    """The process's resident kB by kind (``RssAnon``: the heap; ``RssFile``: code and mapped
    files), from /proc/self/status; empty where there is none."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem"):
            out[key.removeprefix("Rss").lower()] = int(value.split()[0])
    return out


def small_object_kb() -> dict[str, int]:
    """What CPython's own small-object allocator (pymalloc) holds: its arenas (1 MiB each since
    3.10; one goes back to the system only when every block in it is free), the kB they span
    and the kB of blocks in use. ``sys._debugmallocstats`` is the only reader and writes to the
    C ``stderr``, so that descriptor points at a scratch file while it runs, with every other
    thread held (:func:`world_stopped`). Empty when pymalloc is off (``PYTHONMALLOC=malloc``)."""
    import tempfile

    fields = {
        "# arenas allocated current": "arenas",
        "# bytes in allocated blocks": "in_use_kb",
        "Total": "arenas_kb",
    }
    out: dict[str, int] = {}
    with tempfile.TemporaryFile(mode="w+") as scratch, world_stopped():
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(scratch.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        scratch.seek(0)
        for text in scratch:
            key, sep, value = text.partition("=")
            name = fields.get(key.strip())
            if sep and name and name not in out:
                number = int(value.strip().replace(",", ""))
                out[name] = number if name == "arenas" else number // 1024
    return out


def probe(path: Path, every_s: float, frames: int = 0) -> None:
    started = time.time()
    trace = os.environ.get("SOAK_PROBE_TRACE", "")
    baseline_s = float(os.environ.get("SOAK_PROBE_BASELINE_S", "900"))
    base: tracemalloc.Snapshot | None = None
    heap = Heap.glibc()
    while True:
        t0 = time.monotonic()
        line = {
            "time": time.time(),
            "elapsed_s": round(time.time() - started, 1),
            "gc_counts": list(gc.get_count()),
            "gc_stats": gc.get_stats(),
            "types": count_types(),
            "allocated_blocks": sys.getallocatedblocks(),
            "resident_kb": resident_kb(),
            "pymalloc_kb": small_object_kb(),
            "glibc_kb": heap.usage_kb() if heap else {},
        }
        if tracemalloc.is_tracing():
            current, peak = tracemalloc.get_traced_memory()
            line["traced_mb"] = [round(current / 2**20, 1), round(peak / 2**20, 1)]
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            if base is None:
                base = snap
            else:
                line["grew"] = grown_sites(snap, base)
            del snap
        elif frames and time.time() - started >= baseline_s:
            tracemalloc.start(frames)
        if trace:
            with world_stopped():
                line["holders"] = {kind: holders(kind) for kind in trace.split(",")}
        line["probe_s"] = round(time.monotonic() - t0, 3)
        with path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(every_s)


def running(frame: Any, inner: int = 6) -> list[str]:
    """A thread's stack as ``file:function:line``, the project's frames only (``defrag/`` and
    ``bench/``): the outermost one (what the thread is for), then the innermost ``inner``."""
    mine = []
    while frame is not None:
        name = frame.f_code.co_filename
        if "/defrag/" in name or "/bench/" in name:
            mine.append(f"{Path(name).name}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return mine[:inner] + (["…", mine[-1]] if len(mine) > inner else [])


def watch_peaks(path: Path, every_s: float, rise: float = 0.01) -> None:
    """One JSON line each time the interpreter's allocated blocks pass the last line's count by
    ``rise``: the time, the blocks and what every other thread is running then. pymalloc takes
    a new arena only when the blocks in use outgrow those it has, so these lines name the bursts
    that raise its high-water mark (the 5-minute probes see the arenas grow, not why). Reading
    the count is one load of a counter; the stacks are read only at a new high."""
    me = threading.get_ident()
    started = time.time()
    told = 0
    while True:
        blocks = sys.getallocatedblocks()
        if blocks > told * (1 + rise):
            told = blocks
            names = {t.ident: t.name for t in threading.enumerate()}
            stacks = {
                names.get(ident, str(ident)): running(frame)
                for ident, frame in sys._current_frames().items()
                if ident != me
            }
            line = {
                "time": time.time(),
                "elapsed_s": round(time.time() - started, 1),
                "blocks": blocks,
                "threads": {k: v for k, v in stacks.items() if v},
            }
            with path.open("a") as f:
                f.write(json.dumps(line) + "\n")
        time.sleep(every_s)


_PROBE_CODE = {holders.__code__, probe.__code__, describe.__code__}
"""The probe's own frames, which refer to what it walks."""


def main() -> None:
    if os.environ.get("SOAK_PROBE_GC_OFF"):
        # The collector off from the start, as overlapping pauses left it in the long soak:
        # with SOAK_PROBE_TRACE, which reference cycles keep what then piles up.
        gc.disable()
    frames = int(os.environ.get("SOAK_PROBE_TRACEMALLOC", "0") or 0)
    traced = os.environ.get("SOAK_PROBE_TRACEMALLOC_COMMANDS", "run,extender").split(",")
    if not (sys.argv[1:2] and sys.argv[1] in traced):
        frames = 0
    target = os.environ.get("SOAK_PROBE_FILE")
    if target:
        every = float(os.environ.get("SOAK_PROBE_EVERY_S", "600"))
        threading.Thread(
            target=probe, args=(Path(target), every, frames), daemon=True, name="soak-probe"
        ).start()
    peaks = os.environ.get("SOAK_PROBE_PEAKS_FILE")
    if peaks:
        threading.Thread(
            target=watch_peaks,
            args=(Path(peaks), float(os.environ.get("SOAK_PROBE_PEAKS_EVERY_S", "0.005"))),
            daemon=True,
            name="soak-peaks",
        ).start()
    from defrag.cli import main as defrag_main

    sys.argv = ["defrag", *sys.argv[1:]]
    defrag_main()


if __name__ == "__main__":
    main()
