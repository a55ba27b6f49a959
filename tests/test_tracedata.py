"""The reference data: where it is looked for, ``defrag data fetch``'s checksums, and every
bench and command that reads it answering a missing file with one line, never a traceback."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from defrag.adapters.tracedata import (
    DATA_ENV,
    FGD_FILES,
    OPENB_FILES,
    DataError,
    check,
    data_dir,
    fetch,
)
from defrag.cli import app
from defrag.settings import check_environment

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, Path("fallback")),
        ({DATA_ENV: ""}, Path("fallback")),
        ({DATA_ENV: "/srv/data"}, Path("/srv/data")),
    ],
)
def test_data_dir_is_the_setting_else_the_default(environ: dict[str, str], expected: Path) -> None:
    assert data_dir(Path("fallback"), environ) == expected


def test_the_data_setting_is_a_known_defrag_variable() -> None:
    check_environment({DATA_ENV: "/srv/data"})  # not refused as a misspelt setting


def _source(tmp_path: Path, files: dict[str, bytes]) -> tuple[str, dict[str, str]]:
    src = tmp_path / "upstream"
    src.mkdir()
    sums = {}
    for name, body in files.items():
        (src / name).write_bytes(body)
        sums[f"openb/{name}"] = hashlib.sha256(body).hexdigest()
    return src.as_uri(), sums


def test_fetch_downloads_checks_and_keeps_what_is_there(tmp_path: Path) -> None:
    url, sums = _source(tmp_path, {"a.csv": b"x\n1\n", "b.csv": b"y\n2\n"})
    dest = tmp_path / "data"
    assert fetch(dest, url, sums) == [("openb/a.csv", "fetched"), ("openb/b.csv", "fetched")]
    assert (dest / "openb" / "a.csv").read_bytes() == b"x\n1\n"
    assert fetch(dest, url, sums) == [("openb/a.csv", "present"), ("openb/b.csv", "present")]
    assert [s.state for s in check(dest, sums)] == ["ok", "ok"]


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        ({"a.csv": b"tampered\n"}, "is not the expected"),
        ({}, "cannot download"),
    ],
    ids=["checksum-mismatch", "not-served"],
)
def test_fetch_refuses_a_file_it_cannot_verify(
    tmp_path: Path, served: dict[str, bytes], expected: str
) -> None:
    url, _ = _source(tmp_path, served)
    sums = {"openb/a.csv": hashlib.sha256(b"x\n1\n").hexdigest()}
    dest = tmp_path / "data"
    with pytest.raises(DataError) as err:
        fetch(dest, url, sums)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not list((dest / "openb").glob("*")) if (dest / "openb").exists() else True


def test_every_expected_file_has_a_sha256() -> None:
    for name, digest in {**OPENB_FILES, **FGD_FILES}.items():
        assert name.startswith(("openb/", "fgd/")) and len(digest) == 64, name


def test_data_check_and_fetch_cli_answer_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    checked = runner.invoke(app, ["data", "check", "--dir", str(tmp_path)])
    assert checked.exit_code == 1 and "missing" in checked.output
    fetched = runner.invoke(
        app, ["data", "fetch", "--dir", str(tmp_path), "--from", (tmp_path / "none").as_uri()]
    )
    assert fetched.exit_code == 2
    assert "cannot download" in fetched.output and "Traceback" not in fetched.output


# Every bench that reads the trace, with its quick arguments (and plan's openb half).
BENCH_ARGS = [
    ("bench_scoring", ["--pods", "5"]),
    ("bench_fill", ["--traces", "default", "--policies", "best-fit", "--seeds", "1"]),
    ("bench_timeline", ["--seeds", "1"]),
    ("bench_defrag_sim", ["timeline", "--seeds", "1"]),
    ("bench_peers", ["--seeds", "1"]),
    ("bench_packing_limit", ["--traces", "default", "--seeds", "1"]),
    ("bench_plan", ["--only", "openb"]),
]


@pytest.mark.parametrize(("module", "args"), BENCH_ARGS, ids=[m for m, _ in BENCH_ARGS])
def test_a_bench_without_its_data_says_so_in_one_line(
    tmp_path: Path, module: str, args: list[str]
) -> None:
    env = {**os.environ, DATA_ENV: str(tmp_path / "nothing-here")}
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "reference data not found" in lines[0] and "make data" in lines[0]


def test_simulate_without_its_trace_says_so_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["simulate", "--trace", str(tmp_path / "pods.csv"), "--nodes", str(tmp_path / "n.csv")],
    )
    assert result.exit_code == 2
    # the flag and the file, as every missing file is said (docs/cli.md)
    assert f"error: --trace {tmp_path / 'pods.csv'}: no such file" in result.output
    assert "Traceback" not in result.output
