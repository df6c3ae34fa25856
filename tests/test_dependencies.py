"""What shipped code imports is what a plain install brings: the standard library, our own
packages, or a runtime requirement declared in pyproject.toml ``[project].dependencies``.

The dev extra does not count: a module only it provides is missing where a deployment installs
``pip install dispatch`` without extras (issue 19: psutil, imported by the cluster's host
leases, had moved there, and cluster mode died with a traceback on every command). The rule
is read from the source, not from what happens to import in this (dev) environment:

* every ``import`` and ``from ... import`` in ``dispatcher/``, ``registry/`` and ``scope/``,
  at module level and inside functions, classes, ``try`` and ``if`` blocks, plus
  ``importlib.import_module("literal")`` calls;
* except the bodies of ``if TYPE_CHECKING:`` (the project's ``TYPE_CHECKING = False`` idiom
  or ``typing.TYPE_CHECKING``): they never run, only mypy reads them, so a typing-only import
  may name a dev tool. Their ``else:`` branches do run and are checked.

A requirement is resolved to the top-level modules it provides with ``importlib.metadata``
(the installed distributions' file lists, ``packages_distributions()``), so ``pyyaml``
provides ``yaml`` and ``psycopg[binary]`` provides ``psycopg``.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OWN = ("dispatcher", "registry", "scope")
STDLIB_ON_OTHER_VERSIONS = frozenset({"_sha2", "_sha256"})
"""Standard-library modules of another supported Python: CPython's own SHA-256 is ``_sha256``
up to 3.11 and ``_sha2`` from 3.12 (``scope/foundation/digest.py`` tries both)."""


def _normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them (``PyYAML`` == ``pyyaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """Normalized names of ``[project].dependencies`` (extras and versions dropped)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    names = set()
    for spec in project.get("dependencies", []):
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        assert match, f"unreadable requirement {spec!r} in {pyproject}"
        names.add(_normalize(match.group(1)))
    return names


def provided_modules(requirements: set[str]) -> dict[str, str]:
    """Top-level module -> the declared requirement that provides it."""
    provided: dict[str, str] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            if _normalize(dist) in requirements:
                provided[module] = _normalize(dist)
    return provided


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run, skipping ``if TYPE_CHECKING:`` bodies (not their else)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def runtime_imports(source: str, filename: str = "<test>") -> dict[str, int]:
    """Top-level names of the absolute imports that can run -> the first line importing it."""
    found: dict[str, int] = {}
    for node in _runtime_nodes(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = [first.value]
        for name in names:
            top = name.split(".")[0]
            if top and top not in found:
                found[top] = getattr(node, "lineno", 0)
    return found


def undeclared_imports(root: Path = ROOT) -> list[str]:
    """``path:line imports X`` for every import that a plain install would not satisfy."""
    provided = provided_modules(declared_requirements(root / "pyproject.toml"))
    problems = []
    for package in OWN:
        for path in sorted((root / package).rglob("*.py")):
            for module, line in sorted(runtime_imports(path.read_text(), str(path)).items()):
                if module in sys.stdlib_module_names or module in STDLIB_ON_OTHER_VERSIONS:
                    continue
                if module in OWN or module in provided:
                    continue
                problems.append(f"{path.relative_to(root)}:{line} imports {module}")
    return problems


def test_shipped_code_imports_only_the_stdlib_and_declared_requirements() -> None:
    problems = undeclared_imports()
    assert not problems, (
        "shipped code imports modules that neither the standard library nor a requirement in "
        "pyproject.toml [project].dependencies provides (the dev extra does not count): "
        + "; ".join(problems)
    )


def test_every_declared_requirement_resolves_to_modules() -> None:
    # Otherwise the check above could pass only because a requirement is not installed here.
    provided = set(provided_modules(declared_requirements()).values())
    assert declared_requirements() <= provided, declared_requirements() - provided


def test_the_walk_sees_lazy_imports_and_skips_only_type_checking() -> None:
    source = (
        "import os\n"
        "from . import sibling\n"
        "TYPE_CHECKING = False\n"
        "if TYPE_CHECKING:\n"
        "    import typing_only\n"
        "else:\n"
        "    import runs_when_not_checking\n"
        "def f():\n"
        "    import psutil\n"
        "    try:\n"
        "        from yaml.constructor import X\n"
        "    except ImportError:\n"
        "        pass\n"
        "    importlib.import_module('literal.mod')\n"
    )
    assert runtime_imports(source) == {
        "os": 1,
        "runs_when_not_checking": 7,
        "psutil": 9,
        "yaml": 11,
        "literal": 14,
    }


def test_an_undeclared_import_is_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["PyYAML>=6"]\n'
        '[project.optional-dependencies]\ndev = ["pytest"]\n'
    )
    for package in OWN:
        (tmp_path / package).mkdir()
    (tmp_path / "scope" / "a.py").write_text("import yaml\nimport json\nfrom scope import b\n")
    (tmp_path / "registry" / "b.py").write_text("def f():\n    import pytest\n")
    assert undeclared_imports(tmp_path) == ["registry/b.py:2 imports pytest"]
