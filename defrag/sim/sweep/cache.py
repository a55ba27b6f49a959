"""Finished runs on disk, one file per key: a finished run is never made again, and a sweep
that stopped (interrupted, a machine lost) resumes where it was."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class CachedRun:
    key: str
    row: dict[str, Any]
    seconds: float


class RunCache:
    """``<dir>/<key[:2]>/<key>.json``: the run's figures and its wall seconds. A file is written
    whole (a temporary file renamed into place), so a stop mid-write leaves no half run."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedRun | None:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # unreadable: made again, then written whole
        return CachedRun(key, data["row"], float(data["seconds"]))

    def put(self, key: str, row: dict[str, Any], seconds: float) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"key": key, "row": row, "seconds": seconds}, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def keys(self) -> set[str]:
        return {p.stem for p in self.directory.glob("*/*.json")}


__all__ = ["CachedRun", "RunCache"]
