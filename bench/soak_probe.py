"""Runs the ``defrag`` command line with a thread that counts the live objects by type.

    python -m bench.soak_probe run --kubeconfig ... (the arguments of ``defrag``)

The long soak (``bench/bench_soak.py --memory``) starts its daemons and the extender through
this, so that when RSS grows the growth can be named: every ``SOAK_PROBE_EVERY_S``
seconds (600 by default) one JSON line is appended to ``SOAK_PROBE_FILE`` with the time,
the interpreter's garbage collector counts and the number of live objects of each type (the
60 most numerous). Nothing is collected or freed by the probe: it only counts, so the daemon
behaves as it would without it (the count holds the GIL for a moment, ~0.1–1 s at a few
hundred MB of heap).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path


def count_types() -> dict[str, int]:
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    return dict(counts.most_common(60))


def probe(path: Path, every_s: float) -> None:
    started = time.time()
    while True:
        t0 = time.monotonic()
        line = {
            "time": time.time(),
            "elapsed_s": round(time.time() - started, 1),
            "gc_counts": list(gc.get_count()),
            "gc_stats": gc.get_stats(),
            "types": count_types(),
        }
        line["probe_s"] = round(time.monotonic() - t0, 3)
        with path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(every_s)


def main() -> None:
    target = os.environ.get("SOAK_PROBE_FILE")
    if target:
        every = float(os.environ.get("SOAK_PROBE_EVERY_S", "600"))
        threading.Thread(
            target=probe, args=(Path(target), every), daemon=True, name="soak-probe"
        ).start()
    from defrag.cli import main as defrag_main

    sys.argv = ["defrag", *sys.argv[1:]]
    defrag_main()


if __name__ == "__main__":
    main()
