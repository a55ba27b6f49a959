"""Every benchmark through one runner, at HEAD and at a base commit in the same run: ``make
bench`` prints each target's figure beside the base's, the gain, the target and whether it is
met, with the machine's calibration.

    .venv/bin/python -m bench.run_all                       # full size, against HEAD~1
    .venv/bin/python -m bench.run_all --base 6966236 --only plan,cycle --out build/bench
    .venv/bin/python -m bench.run_all --quick --base none   # every bench, tiny, no comparison

Each bench runs as its own process (``python -m bench.<module> <args>``) so one that fails or
leaks cannot spoil the others. The base commit is checked out in a temporary ``git worktree
--detach`` and its benches run there with the same arguments, each one right before or after the
same bench at HEAD (the order alternating), so that a change of load hits both alike. A bench the
base lacks, or that fails there, shows "—" and why; it never stops the run. The machine is
calibrated before and after (``bench.calibrate``: one fixed reference workload) so that a figure
from another machine, or under another load, compares as a ratio. The targets are
``bench.targets.TARGETS``; ``--out DIR`` writes the table to ``DIR/bench.md`` and
``DIR/bench.json``.

Benches that need a real Prometheus say so and are run only when
the ``prometheus`` binary is on PATH; benches that replay the openb trace run only when its files
are in the data directory (``$DEFRAG_DATA_DIR``, else ``~/.cache/defrag/data``; ``make data``
fetches them). Under ``CI=true`` either absence is a failure, never a skip.

Exit status: 0 when every bench ran (or was skipped) at HEAD, 1 when one failed there (a failure
at the base does not count), 2 for a bad option or a base that is not a commit.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import data
from bench.calibrate import calibrate
from bench.comparison import BenchRun, Run, Side, as_json, markdown
from bench.targets import Target, of_bench
from defrag.adapters.tracedata import DATA_ENV

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    module: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    needs_prometheus: bool = False
    needs_data: tuple[str, ...] = ()
    """Reference files (relative to the data directory) the quick and full runs read."""

    @property
    def simulator(self) -> bool:
        """Replays the openb trace (the heavier half of the smoke run)."""
        return self.name in SIMULATOR_BENCHES

    @property
    def targets(self) -> tuple[Target, ...]:
        """The targets read from this bench's output (``bench.targets``)."""
        return of_bench(self.name)

    def argv(self, quick: bool) -> tuple[str, ...]:
        return (f"bench.{self.module}", *(self.quick if quick else self.full))


SIMULATOR_BENCHES = frozenset(
    {
        "fill",
        "timeline",
        "timeline-speed",
        "defrag-sim",
        "peers",
        "checkpoint",
        "spreading",
        "packing-limit",
    }
)
OPENB = tuple(data.trace_files(["default"]))


BENCHES: tuple[Bench, ...] = (
    Bench("scoring", "bench_scoring", (), ("--pods", "20", "--sizes", "1000"), needs_data=OPENB),
    Bench("fill", "bench_fill", (), ("--traces", "default", "--policies", "reserve-binpack",
                                     "--seeds", "1", "--jobs", "1"),
          needs_data=(*OPENB, "fgd/allo.csv")),
    Bench("timeline", "bench_timeline", ("--defrag",),
          ("--policies", "reserve-binpack", "--seeds", "1", "--hours", "2", "--warmup", "1",
           "--jobs", "1"), needs_data=OPENB),
    Bench("timeline-speed", "bench_timeline_speed", ("--runs", "3"),
          ("--hours", "1", "--warmup", "0.5", "--runs", "1"), needs_data=OPENB),
    Bench("defrag-sim", "bench_defrag_sim", ("fill", "--seeds", "10"),
          ("timeline", "--seeds", "1", "--policies", "reserve-binpack", "--jobs", "1"),
          needs_data=OPENB),
    Bench("peers", "bench_peers", ("--seeds", "3", "--jobs", "2"),
          ("--policies", "least-allocated",
           "--defragmenters", "none,defrag-extender,kai-consolidation",
           "--seeds", "1", "--hours", "2", "--warmup", "1", "--jobs", "1"), needs_data=OPENB),
    Bench("checkpoint", "bench_checkpoint", ("--jobs", "2"),
          ("--shares", "1.0", "--seeds", "1", "--no-held-out", "--hours", "2", "--warmup", "1",
           "--jobs", "1"), needs_data=OPENB),
    Bench("spreading", "bench_spreading", ("--jobs", "2"),
          ("--traces", "default", "--schedulers", "least-allocated", "--seeds", "1",
           "--hours", "1", "--warmup", "1", "--every", "1"), needs_data=OPENB),
    Bench("packing-limit", "bench_packing_limit", (),
          ("--traces", "default", "--seeds", "1", "--jobs", "1", "--no-online"),
          needs_data=OPENB),
    Bench("plan", "bench_plan", (), ("--only", "synthetic", "--nodes", "200")),
    Bench("exact-gap", "bench_exact_gap", (), ("--cases", "2")),
    Bench("cycle", "bench_cycle", ("--repeat", "3"),
          ("--nodes", "50", "--pods", "300", "--repeat", "2")),
    Bench("kube", "bench_kube", ("--plan",), ("--nodes", "50", "--pods", "300")),
    Bench("extender", "bench_extender", ("--nodes", "5000"), ("--nodes", "50", "--calls", "50")),
    Bench("watch", "bench_watch", (), ("--nodes", "50", "--pods", "300", "--repeat", "2")),
    Bench("extender-load", "bench_extender_load", (),
          ("--calls", "50", "--clients", "2", "--skip-maximal")),
    Bench("extender-fleet", "bench_extender_load", ("--fleet", "1000,5000,20000"),
          ("--fleet", "60,120", "--fleet-calls", "20")),
    # Needs the control plane binaries (KUBEBUILDER_ASSETS); says "skipped" and exits 0 without.
    Bench("controlplane", "bench_controlplane", ("drain-to-bind", "--runs", "20"),
          ("drain-to-bind", "--runs", "1")),
    # The real kube-scheduler with and without the extender (KUBEBUILDER_ASSETS; "skipped"
    # without, a failure under CI=true).
    Bench("sched-throughput", "bench_sched_throughput",
          ("--nodes", "1000,5000", "--pods", "2000", "--runs", "3", "--qps", "shipped,1000"),
          ("--nodes", "20", "--pods", "40", "--runs", "1", "--window", "20")),
    Bench("detect", "bench_detect", ("--runs", "5"),
          ("--gpus", "20", "--hours", "2", "--runs", "1"), needs_prometheus=True),
    Bench("detect-10k", "bench_detect", ("--gpus", "10000", "--runs", "3"),
          ("--gpus", "20", "--hours", "2", "--runs", "1"), needs_prometheus=True),
    Bench("leak-corpus", "bench_leak_corpus", ("--per-cell", "10"),
          ("--per-cell", "1", "--mix", "20", "--noises", "0", "400")),
    Bench("starvation-corpus", "bench_starvation_corpus", ("--seeds", "100-119"),
          ("--seeds", "0", "--pending", "10"), needs_prometheus=True),
    # A settings sweep on a loopback distributed cluster against the local runner (the sweep extra).
    Bench("sweep", "bench_sweep", (), ("--runs", "9", "--workers", "1")),
    # Held-out seeds (tuned on 1-3): docs/benchmarks.md, "Leaks on every workload shape".
    Bench("leak-shapes", "bench_leak_shapes",
          ("--seeds", "101,102,103", "--per-family", "10", "--moving-per-family", "6"),
          ("--seeds", "1", "--per-family", "1", "--moving-per-family", "1"),
          needs_prometheus=True),
    # The chaos soak on the real control plane (KUBEBUILDER_ASSETS; "skipped" without).
    Bench("soak", "bench_soak", ("--seed", "1", "--cycles", "1000"),
          ("--seed", "1", "--cycles", "40", "--nodes", "6", "--drain-s", "15")),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    bench: Bench
    status: str
    seconds: float
    output: str = ""
    reason: str = ""
    load: float | None = None

    def side(self) -> Side:
        return Side(self.status, self.seconds, self.output, self.reason, self.load)


class BaseError(Exception):
    """The base given is not a commit of this repository (or git cannot check it out)."""


def _unavailable(bench: Bench) -> Outcome | None:
    """A skip (or, under ``CI=true``, a failure) when the bench's binary or data is missing."""
    ci = os.environ.get("CI") == "true"
    if bench.needs_prometheus and shutil.which("prometheus") is None:
        if ci:
            print(f"== {bench.name}: prometheus is not installed (CI=true: a failure)", flush=True)
            return Outcome(bench, "failed: no prometheus", 0.0)
        print(f"== {bench.name}: skipped, prometheus is not installed", flush=True)
        return Outcome(bench, "skipped (no prometheus)", 0.0)
    absent = data.missing(data.DEFAULT, bench.needs_data)
    if absent:
        message = data.missing_message(data.DEFAULT, absent)
        if ci:
            print(f"== {bench.name}: {message} (CI=true: a failure)", flush=True)
            return Outcome(bench, f"failed: {message}", 0.0)
        print(f"== {bench.name}: skipped, {message}", flush=True)
        return Outcome(bench, f"skipped: {message}", 0.0)
    return None


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run(
    bench: Bench,
    quick: bool,
    tree: Path = ROOT,
    *,
    label: str = "",
    check_keys: bool = True,
) -> Outcome:
    """``bench`` run from the checkout ``tree`` (its own ``PYTHONPATH`` and working directory).

    With ``check_keys`` a bench that exits 0 but prints no line for one of its targets fails:
    the smoke runs keep the targets' keys true to what the benches print."""
    unavailable = _unavailable(bench)
    if unavailable is not None:
        return unavailable
    where = f" @ {label}" if label else ""
    if not (tree / "bench" / f"{bench.module}.py").is_file():
        reason = f"bench/{bench.module}.py is not in {label or tree}"
        print(f"== {bench.name}{where}: absent ({reason})", flush=True)
        return Outcome(bench, "absent", 0.0, reason=reason)
    argv = [sys.executable, "-m", *bench.argv(quick)]
    # Both checkouts read the same reference data, wherever the runner found it.
    env = {**os.environ, "PYTHONPATH": str(tree), DATA_ENV: str(data.DEFAULT.resolve())}
    print(f"== {bench.name}{where}: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tree, env=env
    ) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:  # shown as it comes, kept for the targets table
                print(line, end="", flush=True)
                lines.append(line)
        except BaseException:  # the runner stopped (Ctrl-C, SIGTERM): the bench ends with it
            proc.terminate()
            raise
    took = time.monotonic() - started
    output = "".join(lines)
    load = os.getloadavg()[0]
    if proc.returncode != 0:
        return Outcome(bench, f"failed ({proc.returncode})", took, output, _last_line(output), load)
    skipped = re.search(r"^skipped:? (.*)$", output, re.MULTILINE)
    if skipped:  # the control-plane benches without their binaries
        return Outcome(bench, f"skipped: {skipped.group(1)}", took, output, load=load)
    if check_keys:
        unread = [t.label for t in bench.targets if t.read(output, full=False) is None]
        if unread:
            reason = f"printed no line for target(s) {'; '.join(unread)} (bench/targets.py)"
            return Outcome(bench, f"failed: {reason}", took, output, reason, load)
    return Outcome(bench, "ok", took, output, load=load)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BaseError(_last_line(done.stderr or done.stdout))
    return done.stdout.strip()


def head_label(root: Path) -> str:
    """HEAD's short commit, ``+changes`` when tracked files differ from it (what is measured)."""
    try:
        sha = _git(root, "rev-parse", "--short", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (BaseError, OSError):
        return "working tree"
    return f"{sha}+changes" if dirty else sha


@contextmanager
def checkout(root: Path, rev: str) -> Iterator[tuple[str, Path]]:
    """``rev`` checked out in a temporary detached worktree of ``root``'s repository, removed
    afterwards: its short commit and its folder."""
    try:
        sha = _git(root, "rev-parse", "--verify", "--quiet", "--short", f"{rev}^{{commit}}")
    except BaseError as exc:
        raise BaseError(f"{rev!r} is not a commit of {root} ({exc})") from None
    except OSError as exc:
        raise BaseError(f"git could not be run ({exc})") from None
    folder = Path(tempfile.mkdtemp(prefix="defrag-bench-base-"))
    tree = folder / sha
    try:
        _git(root, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        yield sha, tree
    finally:
        with suppress(BaseError):
            _git(root, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "-C", str(root), "worktree", "prune"], capture_output=True)


def run_pair(
    bench: Bench, quick: bool, head: Path, base: tuple[str, Path] | None, base_first: bool
) -> BenchRun:
    """``bench`` at HEAD and at the base, one right after the other."""
    command = " ".join(bench.argv(quick))
    if base is None:
        return BenchRun(bench.name, command, run(bench, quick, head).side())
    label, tree = base
    sides: dict[str, Side] = {}
    for which in ("base", "head") if base_first else ("head", "base"):
        if which == "head":
            sides["head"] = run(bench, quick, head, label="HEAD").side()
        else:
            sides["base"] = run(bench, quick, tree, label=label, check_keys=False).side()
    return BenchRun(bench.name, command, sides["head"], sides["base"])


def measure(benches: list[Bench], quick: bool, root: Path, base: tuple[str, Path] | None) -> Run:
    """Calibrate, run each bench at HEAD and the base (alternating which goes first),
    calibrate again."""
    runs = 1 if quick else 5
    head = head_label(root)
    load_before = os.getloadavg()[0]
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    before = calibrate(runs)
    print(f"calibration: {before:.3f} s (bench.calibrate, median of {runs})", flush=True)
    results = tuple(run_pair(b, quick, root, base, i % 2 == 1) for i, b in enumerate(benches))
    after = calibrate(runs)
    return Run(
        head=head,
        base=base[0] if base else None,
        quick=quick,
        calibration=(before, after),
        loads=(load_before, os.getloadavg()[0]),
        benches=results,
        started=started,
    )


def write_logs(result: Run, folder: Path) -> None:
    """Each bench's output at HEAD and at the base, as it printed it: ``<name>.head.log``."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for b in result.benches:
        for which, side in (("head", b.head), ("base", b.base)):
            if side is not None and side.output:
                (folder / f"{b.name}.{which}.log").write_text(side.output)


def _stop(signum: int, _frame: object) -> None:
    # A SIGTERM unwinds like Ctrl-C: the running bench is stopped, the base's worktree removed.
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of each bench")
    ap.add_argument("--only", default="", help="comma-separated bench names")
    ap.add_argument(
        "--base",
        default="HEAD~1",
        help="the commit each bench is also run at, in the same run (default HEAD~1; "
        "'none': HEAD only)",
    )
    ap.add_argument("--out", type=Path, help="write bench.md and bench.json into this folder")
    args = ap.parse_args(argv)
    names = {n for n in args.only.split(",") if n}
    known = [b.name for b in BENCHES]
    if names - set(known):
        ap.error(f"unknown bench(es) {', '.join(sorted(names - set(known)))}; known: "
                 f"{', '.join(known)}")  # fmt: skip
    chosen = [b for b in BENCHES if not names or b.name in names]
    if args.out is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"error: --out {args.out}: {exc.strerror}", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, _stop)
    try:
        if args.base == "none":
            result = measure(chosen, args.quick, ROOT, None)
        else:
            with checkout(ROOT, args.base) as base:
                result = measure(chosen, args.quick, ROOT, base)
    except BaseError as exc:
        print(f"error: --base: {exc}; --base none (make bench BASE=none) runs HEAD only",
              file=sys.stderr)  # fmt: skip
        return 2
    table = markdown(result)
    print("\n" + "\n".join(table), flush=True)
    if args.out is not None:
        (args.out / "bench.md").write_text("\n".join(table) + "\n")
        (args.out / "bench.json").write_text(as_json(result) + "\n")
        write_logs(result, args.out / "logs")
        print(f"(written: {args.out / 'bench.md'}, {args.out / 'bench.json'}, {args.out / 'logs'})")
    failed = [b.name for b in result.benches if b.head.status.startswith(("failed", "absent"))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
