"""The reference data the simulator's benchmarks and tests read: where it lives, where the openb
trace comes from, and the checksum of every file.

The data is never part of the package or the repository (the trace's terms allow research use
and ask for a citation, see docs/benchmarks.md). It lives in one directory, ``DEFRAG_DATA_DIR``
(default ``~/.cache/defrag/data``, under ``$XDG_CACHE_HOME`` when that is set), laid out as
``openb/<file>.csv`` (the Alibaba GPU trace, cluster-trace-gpu-v2023) and ``fgd/<file>.csv``
(the published results of the FGD paper's simulator). ``defrag data fetch`` downloads the
openb files and checks each one against its SHA-256 below before it is put in place;
``defrag data check`` says what is missing or altered.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DATA_ENV = "DEFRAG_DATA_DIR"
"""The one data setting: the directory holding ``openb/`` and ``fgd/``."""


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's cache: ``$XDG_CACHE_HOME/defrag/data``, else ``~/.cache/defrag/data`` — where
    ``defrag data fetch`` puts the files and every reader looks when ``DEFRAG_DATA_DIR`` is not
    set."""
    env = os.environ if environ is None else environ
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "defrag" / "data"


OPENB_URL = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv/"
)
"""Where ``defrag data fetch`` downloads the openb files from (``--from`` overrides it)."""

OPENB_FILES: Mapping[str, str] = {
    "openb/openb_node_list_all_node.csv":
        "5a85c2af79c66a1efff8bbcbda430400aae56d8431370d738480967e1a9c6b15",
    "openb/openb_node_list_gpu_node.csv":
        "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5",
    "openb/openb_pod_list_cpu050.csv":
        "747f43247bffc2b0bb081d7f61f0705ca8d390dafc0b647e642c92f3baf3ba1e",
    "openb/openb_pod_list_default.csv":
        "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8",
    "openb/openb_pod_list_gpushare40.csv":
        "d83ce79a4eb6987524bedbb0c65e41aed3a36bf6c1b78b86234c3687a07e1d40",
    "openb/openb_pod_list_gpuspec10.csv":
        "2dc7e4cb9480484f08539720b433a9ec9ab5d76b396f3f7557c53a2ff78a7611",
    "openb/openb_pod_list_multigpu20.csv":
        "d9ec6f6c74fb980cc0b81239470c6353fceea077ea9abd610003b604c7cc2b01",
}  # fmt: skip
"""The openb files the tests and benchmarks read, with their SHA-256."""

FGD_FILES: Mapping[str, str] = {
    "fgd/allo.csv": "25615a7baeef08dbe6609d87022eac6a300b598464ca047626488d44186b2e04",
    "fgd/frag.csv": "9537657f28591ba0a9d93b4440ea7886e8869e401e6a648bcbc655a1d1a87d7f",
    "fgd/frag_ratio.csv": "e503608b766bf610d796fd476d824b1478f56137b2bd93d9f77623f042c72cef",
}
"""The FGD paper's figures (checked by ``defrag data check``; not downloaded: they are the
paper simulator's results, laid out for these tests, and come with the shared data)."""

HOW_TO_GET = "run `make data` (or `defrag data fetch --dir DIR`) and set DEFRAG_DATA_DIR=DIR"


class DataError(Exception):
    """A data file that is missing, cannot be downloaded or does not match its checksum;
    ``unreachable`` when the server could not be reached at all (no answer, not a refusal)."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True, slots=True)
class FileState:
    """One expected file: ``ok``, ``missing`` or ``altered`` (its checksum differs)."""

    name: str
    state: str


def data_dir(default: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """``DEFRAG_DATA_DIR`` when set (and not empty), else ``default``, else the user's cache
    (:func:`default_data_dir`)."""
    env = os.environ if environ is None else environ
    value = env.get(DATA_ENV, "")
    return Path(value) if value else default or default_data_dir(env)


def missing_message(data: Path, names: list[str]) -> str:
    """One line: which files are missing under ``data`` and how to get them."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"reference data not found: {shown} under {data} ({HOW_TO_GET})"


def missing(data: Path, names: list[str] | tuple[str, ...]) -> list[str]:
    """The names (relative to ``data``) that are not files there."""
    return [n for n in names if not (data / n).is_file()]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check(data: Path, files: Mapping[str, str] | None = None) -> list[FileState]:
    """The state of every expected file under ``data``."""
    expected = files if files is not None else {**OPENB_FILES, **FGD_FILES}
    states = []
    for name, digest in expected.items():
        path = data / name
        if not path.is_file():
            states.append(FileState(name, "missing"))
        else:
            states.append(FileState(name, "ok" if sha256(path) == digest else "altered"))
    return states


Opener = Callable[[str], IO[bytes]]


def _urlopen(url: str) -> IO[bytes]:
    response: IO[bytes] = urllib.request.urlopen(url, timeout=60)
    return response


def fetch(
    dest: Path,
    base_url: str = OPENB_URL,
    files: Mapping[str, str] = OPENB_FILES,
    opener: Opener = _urlopen,
    force: bool = False,
) -> list[tuple[str, str]]:
    """Download every file of ``files`` (``openb/<name>`` from ``base_url + <name>``) into
    ``dest``, checking its SHA-256 before it replaces anything; a file already there with the
    right checksum is kept (unless ``force``). Returns ``(name, "fetched" | "present")`` pairs;
    raises :class:`DataError` (one line) on the first file that cannot be had."""
    done: list[tuple[str, str]] = []
    for name, digest in files.items():
        target = dest / name
        if not force and target.is_file() and sha256(target) == digest:
            done.append((name, "present"))
            continue
        url = base_url.rstrip("/") + "/" + name.split("/", 1)[-1]
        partial = target.with_name(target.name + ".part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with opener(url) as response, partial.open("wb") as out:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
        except (OSError, urllib.error.URLError) as exc:
            partial.unlink(missing_ok=True)
            reason = getattr(exc, "reason", None) or exc.strerror or exc
            # no connection to an http(s) server, as opposed to its answer or a local file
            unreachable = (
                isinstance(exc, urllib.error.URLError)
                and not isinstance(exc, urllib.error.HTTPError)
                and isinstance(exc.reason, OSError)
                and url.startswith(("http://", "https://"))
            )
            raise DataError(f"{url}: cannot download: {reason}", unreachable) from None
        got = sha256(partial)
        if got != digest:
            partial.unlink()
            raise DataError(f"{url}: SHA-256 {got} is not the expected {digest}; nothing written")
        partial.replace(target)
        done.append((name, "fetched"))
    return done
