"""Project-wide rules: import direction, documented config keys, no literal /tmp."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dispatcher import configdoc
from dispatcher.settings import SCHEMA
from scope.foundation.schema import documented_keys

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scope", "registry", "dispatcher")
# A package may import only the packages after it in this order.
ALLOWED = {"dispatcher": {"registry", "scope"}, "registry": {"scope"}, "scope": set()}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value.split(".")[0])
                elif isinstance(arg, ast.JoinedStr) and arg.values:
                    first = arg.values[0]
                    if isinstance(first, ast.Constant):
                        found.add(str(first.value).split(".")[0])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_one_way(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        ours = _imports(path) & set(PACKAGES) - {package}
        bad = ours - ALLOWED[package]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, offenders


def test_every_config_key_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = [key for key, *_ in documented_keys(SCHEMA) if f"`{key}`" not in doc]
    assert not missing, f"undocumented keys (run python -m dispatcher.configdoc --write): {missing}"


def test_generated_key_reference_is_current() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert configdoc.rewrite(doc) == doc, "run: python -m dispatcher.configdoc --write " + str(
        Path("docs") / "configuration.md"
    )


def test_packages_never_hard_code_tmp() -> None:
    pattern = re.compile(r"""["']/tmp\b""")
    offenders = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if pattern.search(path.read_text())
    ]
    assert not offenders, f"use tempfile/TMPDIR instead of a literal /tmp: {offenders}"


def test_the_three_packages_and_top_level_layout_exist() -> None:
    for name in ("pyproject.toml", "dispatcher", "scope", "registry", "tests", "docs", "contrib"):
        assert (ROOT / name).exists(), name
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").exists()


def test_foundation_imports_nothing_of_placement() -> None:
    """scope/foundation/ is what every package stands on; it must not lean on placement code."""
    offenders = []
    for path in sorted((ROOT / "scope" / "foundation").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mod = node.module
                if mod.split(".")[0] in PACKAGES and not mod.startswith("scope.foundation"):
                    offenders.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not offenders, offenders
