"""The later-detection profiler names a folder that holds no bench TSDB in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import profile_detect_later


def test_a_folder_without_the_bench_tsdb_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert profile_detect_later.main([str(tmp_path)]) == 2
    assert capsys.readouterr().out == (
        f"error: {tmp_path}: no TSDB of bench_detect --recorded --data there\n"
    )
