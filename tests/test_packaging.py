"""The wheel, installed outside the checkout, runs: the demo, the packaged rules, the help, the
version. One test (it builds a wheel and a venv, about half a minute on 2 cores).

The fresh venv holds the wheel alone; its dependencies come from the running interpreter's
site-packages through a ``.pth`` line (a path entry only: the editable install's import hook
there is never run, so ``defrag`` can only come from the wheel). Nothing is downloaded: the
wheel is built without build isolation by the setuptools the dev extras install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import defrag

ROOT = Path(__file__).resolve().parents[1]
# Build outputs and caches of the checkout; everything else is the source a wheel is built from.
_SKIP = {".venv", ".git", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache"}
_SKIP_SUFFIXES = (".egg-info", ".png", ".pyc")


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _SKIP or n.endswith(_SKIP_SUFFIXES) or n.startswith(".")}


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(args)} → {done.returncode}\n{done.stderr}"
    return done


def test_the_wheel_installed_outside_the_checkout_runs_the_demo_and_finds_its_rules(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DEFRAG")}
    env["MPLCONFIGDIR"] = str(tmp_path / "mpl")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_ignore)  # rules link stays a link
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    done = _run([*build, "-v", "-w", str(dist), str(src)], tmp_path, env)
    assert "Deprecat" not in done.stderr, done.stderr  # setuptools warns of no deprecated field
    (wheel,) = dist.glob("defrag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"defrag/data/rules/{n}.yaml" for n in ("fragmentation", "starvation")} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    _run([*pip, str(wheel)], tmp_path, env)
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
             tmp_path, env).stdout.strip()
    )  # fmt: skip
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    work = tmp_path / "elsewhere"  # no rules/ here, no checkout above
    work.mkdir()
    cli = str(venv / "bin" / "defrag")
    where = _run([str(python), "-c", "import defrag; print(defrag.__file__)"], work, env)
    assert where.stdout.startswith(str(venv)), where.stdout

    version = _run([cli, "--version"], work, env)
    assert version.stdout.strip() == f"defrag {defrag.__version__}"

    checked = _run([cli, "rules", "check", "-o", "json"], work, env)
    doc = json.loads(checked.stdout)
    assert doc["rules"] and all(f.startswith(str(venv)) for f in doc["files"])

    demo = _run([cli, "demo", "--cycles", "4", "--plot", "demo.png", "-o", "json"], work, env)
    result = json.loads(demo.stdout)
    assert result["train_llm_node"] is not None  # the starving job runs after the window
    assert (work / "demo.png").read_bytes()[:4] == b"\x89PNG"

    helped = _run([cli, "detect", "--help"], work, env)
    assert "--prometheus" in helped.stdout and "--output" in helped.stdout
    for done in (version, checked, demo, helped):
        assert "Traceback" not in done.stderr
