"""``make bench``'s runner: the targets table names real benches, reads each figure from the line
its bench prints, pairs HEAD's figure with the base commit's from the same run, computes the
gain, marks each target met or missed, and shows "—" with the reason where the base has no
figure. The benches here are tiny fakes in a temporary git repository (no real bench runs);
that every target's key matches what its real bench prints is checked by the smoke runs
(tests/test_bench_smoke*.py run each bench's quick mode through ``run``, which fails a bench
printing no line for one of its targets)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_sched_throughput import ModeRun, report
from bench.comparison import BenchRun, Run, Side, as_json, markdown, rows
from bench.run_all import (
    BENCHES,
    BaseError,
    Bench,
    checkout,
    main,
    measure,
    run,
    run_pair,
    write_logs,
)
from bench.targets import TARGETS, Better, Target

# Printed by `python -m bench.bench_plan --nodes 300` (bench/bench_plan.py, this repository).
PLAN_OUT = """\
| cluster | nodes | GPUs | allocated | steps | targets | plan s | target s | peak MiB |
|---|---|---|---|---|---|---|---|---|
| openb 90% | 1213 | 6212 | 90.0% | 4 | 3 | 0.55 | 2 | 60 |
| synthetic 10000 | 10000 | 80000 | 71.3% | 50 | 40 | 6.20 | 20 | 900 |
"""
# Printed by `python -m bench.bench_extender --nodes 5000` (bench/bench_extender.py).
EXTENDER_OUT = """\
prioritize, nodenames mode, 5000 nodes, policy reserve-binpack, 2000 calls (pods of 1/2/4/8 GPUs in turn)
path                      p50 ms    p99 ms    max ms
handler CPU time            2.74      3.35      6.01
handler wall time           2.80      3.90      6.50
HTTP keep-alive            12.79     33.79     98.35
"""  # noqa: E501
# Printed by `python -m bench.bench_detect --gpus 20 --hours 2 --runs 1` (bench/bench_detect.py).
DETECT_OUT = """\
GPUs                                                   20
samples backfilled                                  9,660
detect, min of 1 (s)                                0.095
detect, median of 1 (s)                             0.095
detect, max (s)                                     0.095
"""


def _target(label: str) -> Target:
    return next(t for t in TARGETS if t.label == label)


def test_every_target_names_a_bench_and_reads_a_named_value() -> None:
    names = {b.name for b in BENCHES}
    labels = [t.label for t in TARGETS]
    assert len(labels) == len(set(labels))
    for t in TARGETS:
        assert t.bench in names, t
        groups = re.compile(t.key).groupindex
        assert "value" in groups, t
        assert {k for k, _ in t.where} <= set(groups), t
        assert t.source


def test_a_figure_is_read_from_the_line_its_size_names() -> None:
    plan = _target("plan, 10,000 nodes")
    assert plan.figure(PLAN_OUT) == 6.2
    assert _target("plan, openb at 90%").figure(PLAN_OUT) == 0.55
    assert _target("prioritize p99 over HTTP, 5,000 nodes").figure(EXTENDER_OUT) == 33.79
    small = EXTENDER_OUT.replace("5000 nodes", "50 nodes")
    assert _target("prioritize p99 over HTTP, 5,000 nodes").figure(small) is None
    # a quick run's line, read without its size
    quick = _target("detection, 1,000 GPUs, median").read(DETECT_OUT, full=False)
    assert quick is not None and quick.value == 0.095 and dict(quick.about) == {"gpus": "20"}
    assert _target("detection, 1,000 GPUs, median").figure(DETECT_OUT) is None


def test_the_extender_cost_lines_the_throughput_bench_writes_are_read() -> None:
    def mode(name: str, nodes: int, rate: float) -> ModeRun:
        ext = {} if name == "alone" else {"filter": 1.0, "prioritize": 2.0}
        return ModeRun(name, "1000", nodes, 2000, rate, 10.0, ext, ext, {}, ext, 1.0)

    runs = [mode(m, 5000, r) for m, r in (("alone", 100.0), ("names", 85.0), ("nodes", 50.0))]
    output = "\n".join(report(runs))
    assert _target("extender cost (names), 5,000 nodes, kube-scheduler qps 1000").figure(
        output
    ) == pytest.approx(15.0)
    assert _target("extender cost (nodes), 5,000 nodes, kube-scheduler qps 1000").figure(
        output
    ) == pytest.approx(50.0)


def test_a_quick_run_reads_each_mode_from_its_own_line() -> None:
    def mode(name: str, rate: float) -> ModeRun:
        ext = {} if name == "alone" else {"filter": 1.0, "prioritize": 2.0}
        return ModeRun(name, "shipped", 20, 40, rate, 10.0, ext, ext, {}, ext, 1.0)

    runs = [mode(m, r) for m, r in (("alone", 200.0), ("names", 100.0), ("nodes", 40.0))]
    bench = BenchRun("sched-throughput", "", Side("ok", output="\n".join(report(runs))))
    shown = {
        dict(r.head.about)["mode"]: r.head.value
        for r in rows(_run((bench,), quick=True))
        if r.head is not None
    }
    assert shown == pytest.approx({"names": 50.0, "nodes": 80.0})


def _run(benches: tuple[BenchRun, ...], quick: bool = False) -> Run:
    return Run("bbbbbbb", "aaaaaaa", quick, (0.5, 0.7), (3.0, 4.0), benches)


def test_figures_are_paired_with_the_base_and_judged() -> None:
    old_plan = PLAN_OUT.replace("| 6.20 |", "| 12.40 |").replace("| 0.55 |", "| 0.50 |")
    benches = (
        BenchRun("plan", "bench.bench_plan", Side("ok", 9.0, PLAN_OUT), Side("ok", 20.0, old_plan)),
        BenchRun(
            "extender",
            "bench.bench_extender --nodes 5000",
            Side("ok", 3.0, EXTENDER_OUT),
            Side("failed (2)", 0.1, "usage: …", "error: unrecognized arguments: --nodes"),
        ),
        BenchRun(
            "detect-10k",
            "bench.bench_detect --gpus 10000",
            Side("ok", 30.0, DETECT_OUT.replace(" 20\n", " 10000\n")),
            Side("absent", reason="bench/bench_detect.py is not in aaaaaaa"),
        ),
    )
    by_label = {r.target.label: r for r in rows(_run(benches))}
    assert set(by_label) == {
        "plan, openb at 90%",
        "plan, 10,000 nodes",
        "prioritize p99 over HTTP, 5,000 nodes",
        "detection, 10,000 GPUs, median",
    }
    big = by_label["plan, 10,000 nodes"]
    assert (big.head and big.head.value, big.base and big.base.value) == (6.2, 12.4)
    assert big.gain == pytest.approx(2.0)  # twice as fast as the base
    assert big.met is False  # 6.2 s against ≤ 5 s
    openb = by_label["plan, openb at 90%"]
    assert openb.gain == pytest.approx(0.5 / 0.55) and openb.met is True
    ext = by_label["prioritize p99 over HTTP, 5,000 nodes"]
    assert ext.base is None and ext.gain is None and ext.met is False
    assert ext.base_missing == "error: unrecognized arguments: --nodes"
    detect = by_label["detection, 10,000 GPUs, median"]
    assert detect.head is not None and detect.met is True
    assert detect.base_missing == "bench/bench_detect.py is not in aaaaaaa"

    table = "\n".join(markdown(_run(benches)))
    assert "calibration 0.500 s before, 0.700 s after" in table
    assert "| plan, 10,000 nodes | plan | 6.2 s | 12.4 s | 2.00× | ≤ 5 s | no | 10.3 |" in table
    assert (
        "| prioritize p99 over HTTP, 5,000 nodes | extender | 33.79 ms "
        "| — (error: unrecognized arguments: --nodes) | — | ≤ 5 ms | no | 0.0563 |"
    ) in table
    assert "| — (bench/bench_detect.py is not in aaaaaaa) |" in table
    assert "| plan | `bench.bench_plan` | ok | ok | 9.0 / 20.0 |" in table
    assert "| bench/bench_detect.py is not in aaaaaaa | 30.0 / — |" in table
    doc = __import__("json").loads(as_json(_run(benches)))
    assert doc["calibration_s"] == {"before": 0.5, "after": 0.7}
    assert {f["figure"]: f["met"] for f in doc["figures"]}["plan, 10,000 nodes"] is False


def test_a_higher_is_better_figure_gains_when_it_grows() -> None:
    rate = Target("rate", "fake", r"rate (?P<value>[\d.]+)", "pods/s", 100.0, Better.HIGHER, "t")
    bench = BenchRun("fake", "", Side("ok", output="rate 120"), Side("ok", output="rate 60"))
    (row,) = rows(_run((bench,)), [rate])
    assert row.gain == pytest.approx(2.0) and row.met is True


def test_a_quick_run_shows_each_line_once_and_judges_nothing() -> None:
    synthetic = "| synthetic 200 | 200 | 1600 | 70.0% | 9 | 5 | 0.08 | 20 | 60 |"
    quick_plan = "\n".join([*PLAN_OUT.splitlines()[:2], synthetic])
    bench = BenchRun("plan", "", Side("ok", output=quick_plan), None)
    table = rows(_run((bench,), quick=True))
    # one line, shown under the target nearest to it (synthetic, not openb)
    assert [(r.target.label, r.head and r.head.value, r.met) for r in table] == [
        ("plan, 10,000 nodes", 0.08, None)
    ]
    text = "\n".join(markdown(_run((bench,), quick=True)))
    assert "plan, 10,000 nodes (quick: cluster synthetic 200)" in text
    assert "≤ 5 s (full size)" in text


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
    )


def _write(repo: Path, name: str, text: str) -> None:
    (repo / "bench" / name).write_text(text)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Two commits: at the base the fake bench takes 2.0 s and the broken one fails; at HEAD it
    takes 1.0 s, the broken one works and a new bench appears."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    _git(repo, "init", "-q")
    _write(repo, "__init__.py", "")
    _write(repo, "bench_fake.py", 'print("fake took 2.0 s")\n')
    _write(repo, "bench_broken.py", 'raise SystemExit("error: --size: no such option")\n')
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    _write(repo, "bench_fake.py", 'print("fake took 1.0 s")\n')
    _write(repo, "bench_broken.py", 'print("fake took 3.0 s")\n')
    _write(repo, "bench_new.py", 'print("fake took 4.0 s")\n')
    _write(repo, "bench_skips.py", 'print("skipped: no control plane binaries")\n')
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "head")
    return repo


FAKE = Target("fake time", "fake", r"fake took (?P<value>[\d.]+) s", "s", 1.5, Better.LOWER, "t")


def test_each_bench_runs_at_head_and_at_the_base_in_one_run(repo: Path, tmp_path: Path) -> None:
    benches = [Bench(n, f"bench_{n}", (), ()) for n in ("fake", "broken", "new", "skips")]
    with checkout(repo, "HEAD~1") as base:
        sha, tree = base
        assert tree.is_dir() and not (tree / "bench" / "bench_new.py").exists()
        pairs = tuple(run_pair(b, True, repo, base, i % 2 == 1) for i, b in enumerate(benches))
    assert not tree.exists()  # the base's worktree is gone, and git no longer lists it
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True)
    assert str(tree).encode() not in listed.stdout
    fake, broken, new, skips = pairs
    assert (fake.head.status, fake.base and fake.base.status) == ("ok", "ok")
    assert broken.base is not None and broken.base.status == "failed (1)"
    assert broken.base.reason == "error: --size: no such option"
    assert new.base is not None and new.base.status == "absent"
    assert skips.head.status == "skipped: no control plane binaries"

    targets = [FAKE, *(Target(f"{n} time", n, FAKE.key, "s", 9.0, Better.LOWER, "t")
                       for n in ("broken", "new"))]  # fmt: skip
    result = Run("head", sha, False, (0.4, 0.4), (1.0, 1.0), pairs)
    by_label = {r.target.label: r for r in rows(result, targets)}
    assert by_label["fake time"].gain == pytest.approx(2.0)
    assert by_label["fake time"].met is True
    assert by_label["broken time"].head is not None and by_label["broken time"].base is None
    assert by_label["broken time"].base_missing == "error: --size: no such option"
    assert by_label["new time"].base_missing == f"bench/bench_new.py is not in {sha}"
    write_logs(result, tmp_path / "logs")
    assert (tmp_path / "logs" / "fake.base.log").read_text() == "fake took 2.0 s\n"
    assert not (tmp_path / "logs" / "new.base.log").exists()


def test_head_and_base_alternate_which_runs_first(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "order.log"
    monkeypatch.setenv("FAKE_ORDER_LOG", str(log))
    logging = "import os, pathlib\nwith open(os.environ['FAKE_ORDER_LOG'], 'a') as f:\n"
    _write(repo, "bench_order.py", logging + "    f.write(pathlib.Path.cwd().name + '\\n')\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "order")
    benches = [Bench("one", "bench_order", (), ()), Bench("two", "bench_order", (), ())]
    with checkout(repo, "HEAD") as base:
        result = measure(benches, True, repo, base)
    sha = base[0]
    assert log.read_text().split() == ["repo", sha, sha, "repo"]
    assert result.base == sha and result.head == sha  # the base may be HEAD itself: the noise
    assert all(c > 0 for c in result.calibration)
    assert [b.head.status for b in result.benches] == ["ok", "ok"]


def test_a_bench_printing_no_line_for_its_target_fails(repo: Path) -> None:
    # "plan" has targets in bench/targets.py; the fake module prints none of their lines.
    fake_plan = Bench("plan", "bench_fake", (), ())
    outcome = run(fake_plan, True, repo)
    assert outcome.status.startswith("failed: printed no line for target(s) plan, openb at 90%")
    assert run(fake_plan, True, repo, check_keys=False).status == "ok"


def test_a_base_that_is_no_commit_is_one_error_line(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        pytest.raises(BaseError, match="'no-such-rev' is not a commit"),
        checkout(repo, "no-such-rev"),
    ):
        pass
    assert main(["--base", "no-such-rev", "--only", "plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --base: 'no-such-rev' is not a commit")


def test_the_runner_starts_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "--only", "no-such-bench"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "unknown bench(es) no-such-bench" in done.stderr
