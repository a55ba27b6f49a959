"""The long soak's probe names where resident memory went: pymalloc's arenas and glibc's heap."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from defrag.adapters.heap import Heap

ROOT = Path(__file__).resolve().parent.parent


def test_small_objects_fill_arenas_and_the_count_sees_them() -> None:
    """In a fresh interpreter (a long-lived one may have room in arenas it holds already):
    200,000 small strings, ~11 MB, need new arenas, and the count sees them in use."""
    script = (
        "import json; from bench.soak_probe import small_object_kb; before = small_object_kb(); "
        "strings = [str(i) * 3 for i in range(200_000)]; "
        "print(json.dumps([before, small_object_kb()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT
    )
    before, grown = json.loads(done.stdout)
    if not before:
        pytest.skip("this interpreter runs without pymalloc")
    assert grown["in_use_kb"] - before["in_use_kb"] > 200_000 * 40 // 1024
    assert grown["arenas"] - before["arenas"] >= 200_000 * 40 // 2**20
    assert grown["arenas_kb"] >= grown["in_use_kb"]


def test_no_pymalloc_no_arenas_and_stderr_is_given_back() -> None:
    script = (
        "import sys; from bench.soak_probe import small_object_kb; "
        "print(small_object_kb()); print('after', file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONMALLOC": "malloc", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert done.stdout.strip() == "{}"
    assert done.stderr.strip() == "after"


@pytest.mark.skipif(Heap.glibc() is None, reason="the C library is not glibc: no mallinfo2")
def test_the_probe_line_carries_both_heaps(tmp_path: Path) -> None:
    from bench import soak_probe

    out = tmp_path / "objects.jsonl"
    threading.Thread(target=soak_probe.probe, args=(out, 3600.0), daemon=True).start()
    for _ in range(200):
        if out.exists() and out.read_text().strip():
            break
        threading.Event().wait(0.05)
    line = json.loads(out.read_text().splitlines()[0])
    assert line["pymalloc_kb"]["arenas"] > 0
    assert line["glibc_kb"]["in_use"] > 0
    assert line["resident_kb"]["anon"] > 0


def test_the_soak_plot_draws_the_probes_heap_and_says_what_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import soak_plot
    from bench.bench_soak import CHAOS_STARTED, WARMUP_S

    (tmp_path / CHAOS_STARTED).write_text("2027-01-15T08:00:00+00:00\n")
    start = datetime.fromisoformat("2027-01-15T08:00:00+00:00").timestamp()
    rows = ["time_utc,elapsed_s,process,pid,rss_kb"]
    probes = []
    for k in range(6):
        t = start + WARMUP_S + 600 * (k - 1)
        stamp = datetime.fromtimestamp(t, UTC).isoformat()
        rows.append(f"{stamp},{600 * k},daemon-defrag,7,{200_000 + 1000 * k}")
        probes.append(
            {
                "time": t,
                "resident_kb": {"anon": 190_000 + 1000 * k},
                "pymalloc_kb": {"arenas": 100 + k, "arenas_kb": 102_400 + 1024 * k,
                                "in_use_kb": 80_000},
                "glibc_kb": {"in_use": 40_000},
            }
        )  # fmt: skip
    (tmp_path / "rss.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "objects-defrag.jsonl").write_text("\n".join(map(json.dumps, probes)) + "\n")
    heap = tmp_path / "heap.png"
    code = soak_plot.main([str(tmp_path / "rss.csv"), "--out", str(tmp_path / "rss.png"),
                           "--heap", str(heap)])  # fmt: skip
    assert code == 0 and heap.stat().st_size > 0
    said = [x for x in capsys.readouterr().out.splitlines() if "heap after" in x]
    # from the first probe at or after the warm-up (k = 1) to the last (k = 5)
    assert said == [
        "defrag heap after the warm-up: RSS (anonymous) +4,000 kB, pymalloc arenas +4,096 kB, "
        "pymalloc in use +0 kB, glibc in use +0 kB"
    ]


def test_a_burst_past_the_high_is_named_by_what_its_thread_runs(tmp_path: Path) -> None:
    """A thread that holds 300,000 new objects a while: the peak watcher writes lines while it
    grows, naming its function (a file under bench/, as the project's are) and not itself."""
    out = tmp_path / "peaks.jsonl"
    script = f"""
import threading, time
from pathlib import Path
from bench.soak_probe import watch_peaks
args = (Path({str(out)!r}), 0.001)
threading.Thread(target=watch_peaks, args=args, daemon=True, name="soak-peaks").start()
time.sleep(0.2)
code = compile('''
def hold_a_burst():
    held = [str(i) * 2 for i in range(300_000)]
    time.sleep(0.3)
    return len(held)
''', "/src/bench/burst.py", "exec")
space = {{"time": time}}
exec(code, space)
t = threading.Thread(target=space["hold_a_burst"], name="burst")
t.start(); t.join()
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=60)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) >= 2
    assert all(b["blocks"] > a["blocks"] * 1.01 for a, b in itertools.pairwise(lines))
    named = [x for x in lines if "burst" in x["threads"]]
    assert named, lines[-1]
    stack = named[-1]["threads"]["burst"]  # innermost first: the comprehension, or its function
    assert stack[0].startswith(("burst.py:<listcomp>:", "burst.py:hold_a_burst:"))
    assert any(frame.startswith("burst.py:hold_a_burst:") for frame in stack)
    assert all("soak-peaks" not in x["threads"] for x in lines)


def test_the_peaks_after_the_warm_up_name_the_threads_away_from_their_wait(
    tmp_path: Path,
) -> None:
    from bench import soak_plot
    from bench.bench_soak import WARMUP_S

    since = 1_000_000.0
    wait = ["kube_watch.py:_events:661"]
    lines = [
        {"time": since + 60, "blocks": 10, "threads": {"watch": wait, "cycle": ["a.py:f:1"]}},
        *(
            {"time": since + WARMUP_S + 60 * k, "blocks": 20 + k, "threads": {"watch": wait}}
            for k in range(3)
        ),
        {
            "time": since + WARMUP_S + 600,
            "blocks": 40,
            "threads": {"watch": ["kube_watch.py:call:571", "jsonio.py:loads:61"]},
        },
    ]
    (tmp_path / "peaks-defrag.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    highs = soak_plot.peak_bursts(tmp_path, since)["defrag"]
    assert [h["blocks"] for h in highs] == [20, 21, 22, 40]  # the warm-up's left out
    assert [h["busy"] for h in highs[:3]] == [{}, {}, {}]  # the watch in its usual wait
    assert highs[3]["busy"] == {"watch": ["kube_watch.py:call:571", "jsonio.py:loads:61"]}
    assert highs[3]["minute"] == round((WARMUP_S + 600) / 60, 1)
