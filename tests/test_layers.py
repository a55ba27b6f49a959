"""The layers contract covers the whole package: a new top-level module or package that is in no
layer would escape import-linter, so it fails here until it is given its place."""

from __future__ import annotations

import tomllib
from pathlib import Path

import defrag

ROOT = Path(defrag.__file__).parent
NOT_CODE = {"data"}  # package data (the shipped rules), no Python


def _layered() -> set[str]:
    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return {name.strip().removeprefix("defrag.") for row in layers for name in row.split("|")}


def _top_level() -> set[str]:
    modules = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    return (modules | packages) - NOT_CODE


def test_every_top_level_module_has_a_layer() -> None:
    assert _top_level() - _layered() == set()


def test_every_layer_names_a_module_that_exists() -> None:
    assert _layered() - _top_level() == set()


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere in the package (imports under TYPE_CHECKING and inside
    functions count): a cycle is how a layer starts leaning on the one above it."""
    import grimp

    graph = grimp.build_graph("defrag")
    cycles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert cycles == []


def test_a_detector_is_one_folder_with_a_pure_core_and_a_registration() -> None:
    """``defrag/detectors/<name>/`` holds ``core.py`` (in the pure-core contract by the
    ``defrag.detectors.*.core`` pattern) and ``registration.py``; importing ``defrag.detectors``
    registers every folder's detector (one import line each)."""
    from defrag.detectors import registry

    folders = {p.name for p in (ROOT / "detectors").iterdir() if (p / "__init__.py").is_file()}
    for name in folders:
        assert (ROOT / "detectors" / name / "core.py").is_file(), name
        assert (ROOT / "detectors" / name / "registration.py").is_file(), name
    assert folders == set(registry.names())
