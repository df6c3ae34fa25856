"""Project-wide rules: import direction (packages, dispatcher layers, registry parts and faces),
documented config keys, no literal /tmp, module and function sizes."""

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


def _module_names(source: str, package: str, filename: str = "<test>") -> set[str]:
    """Every name ``source`` imports, dotted in full: top-level and function-local imports,
    ``TYPE_CHECKING`` blocks, and ``import_module`` calls (an f-string counts by its literal
    prefix). Relative imports are resolved against ``package``. ``from pkg import name`` counts
    as ``pkg`` and ``pkg.name`` (``name`` may be a module)."""
    tree = ast.parse(source, filename)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                elif isinstance(arg, ast.JoinedStr) and arg.values:
                    first = arg.values[0]
                    if isinstance(first, ast.Constant):
                        found.add(str(first.value).rstrip("."))
    return found


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(path: Path) -> set[str]:
    package = _module_of(path) if path.name == "__init__.py" else _module_of(path.parent)
    return _module_names(path.read_text(), package, str(path))


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imports_of(path)}


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


# -- layers inside dispatcher/ -----------------------------------------------------------------

DISPATCHER_LAYERS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    # (layer, rank, modules): a module may import its own layer and lower ranks only. cron and
    # kanban share a rank and must not import each other. The root schema and loader
    # (settings, config, configdoc) gather cron's and kanban's sections, so they are app.
    (
        "foundation",
        0,
        (
            "dispatcher",
            "dispatcher.errors",
            "dispatcher.paths",
            "dispatcher.timefmt",
            "dispatcher.buckets",
            "dispatcher.rollup",
            "dispatcher.rolluptables",
            "dispatcher.envfile",
            "dispatcher.commonsettings",
        ),
    ),
    # The launch core: the life cycle cron and kanban share (outcomes, spawn errors,
    # claimants, worker setup); it knows neither of them.
    ("launch", 1, ("dispatcher.launch",)),
    ("cron", 2, ("dispatcher.cron",)),
    ("kanban", 2, ("dispatcher.kanban",)),
    # The PostgreSQL side of the board-store and ledger seams stands on both.
    ("cluster", 3, ("dispatcher.cluster",)),
    # Notifications read the config into routes and deliver; the stores' write side is in launch.
    ("notify", 3, ("dispatcher.notify",)),
    # The HTTP API's tokens: a store over the state or cluster database, no HTTP.
    ("tokens", 3, ("dispatcher.tokens",)),
    (
        "app",
        4,
        ("dispatcher.app", "dispatcher.settings", "dispatcher.config", "dispatcher.configdoc"),
    ),
    ("gateway", 5, ("dispatcher.gateway",)),
    # dispatch web reads what dispatch status and doctor read (gateway/report.py, doctor.py)
    # and is never imported by the gateway: it stays out of the dispatch path.
    ("web", 6, ("dispatcher.web",)),
    ("cli", 7, ("dispatcher.cli",)),
)


Layers = tuple[tuple[str, int, tuple[str, ...]], ...]


def _layer_in(layers: Layers, module: str) -> str | None:
    """The layer of ``module`` in ``layers`` (a package root such as ``dispatcher`` matches
    only itself, not everything below it)."""
    best: tuple[int, str] | None = None
    for layer, _, modules in layers:
        for prefix in modules:
            inside = "." in prefix and module.startswith(prefix + ".")
            if (module == prefix or inside) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), layer)
    return best[1] if best else None


def _layer(module: str) -> str | None:
    """The layer of a dispatcher module (``dispatcher`` itself matches only exactly)."""
    return _layer_in(DISPATCHER_LAYERS, module)


def _existing_module(name: str) -> str | None:
    """``name`` trimmed to the longest prefix that is a module or package in the tree (an
    imported class or function is not a module)."""
    parts = name.split(".")
    while parts:
        base = ROOT.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def _import_offenders(layers: Layers, module: str, names: set[str], where: str) -> list[str]:
    """The imports ``names`` of ``module`` (shown as ``where``) that point up, or sideways to
    another part of the same rank, in ``layers``."""
    root = layers[0][2][0].split(".")[0]
    rank = {layer: number for layer, number, _ in layers}
    own = _layer_in(layers, module)
    assert own is not None, f"{where} is in no layer: add it to the {root} layers"
    offenders: set[str] = set()
    for name in names:
        if name.split(".")[0] != root:
            continue
        target = _existing_module(name)
        layer = _layer_in(layers, target) if target else None
        if target is None or layer is None:
            offenders.add(f"{where} imports {name}, which is in no layer")
        elif layer != own and rank[layer] >= rank[own]:
            offenders.add(f"{where} ({own}) imports {target} ({layer})")
    return sorted(offenders)


def _layer_offenders(path: Path, layers: Layers = DISPATCHER_LAYERS) -> list[str]:
    where = str(path.relative_to(ROOT))
    return _import_offenders(layers, _module_of(path), _imports_of(path), where)


def test_dispatcher_layers_import_downward_only() -> None:
    offenders = [
        line
        for path in sorted((ROOT / "dispatcher").rglob("*.py"))
        for line in _layer_offenders(path)
    ]
    assert not offenders, offenders


def test_every_layer_names_real_modules() -> None:
    for layer, _, modules in DISPATCHER_LAYERS:
        for module in modules:
            assert _existing_module(module) == module, f"{layer}: {module} does not exist"


def test_import_scan_sees_local_relative_and_dynamic_imports() -> None:
    source = (
        "import dispatcher.errors\n"
        "from . import sibling\n"
        "from ..app.runtime import open_runtime\n"
        "def f():\n"
        "    from dispatcher.cli.context import Context\n"
        "    importlib.import_module('dispatcher.gateway.serve')\n"
        "    importlib.import_module(f'dispatcher.cli.{name}_cmd')\n"
    )
    found = _module_names(source, "dispatcher.kanban")
    assert {
        "dispatcher.errors",
        "dispatcher.kanban.sibling",
        "dispatcher.app.runtime",
        "dispatcher.app.runtime.open_runtime",
        "dispatcher.cli.context",
        "dispatcher.gateway.serve",
        "dispatcher.cli",
    } <= found
    assert _layer("dispatcher.kanban.board") == "kanban"
    assert _layer("dispatcher.settings") == "app"
    assert _layer("dispatcher.nosuch") is None


# -- registry/ by concept ----------------------------------------------------------------------

REGISTRY_LAYERS: Layers = (
    # (part, rank, modules): a module may import its own part and lower ranks only; parts that
    # share a rank never import each other. The contract and its vocabulary stand below every
    # part; the two implementations above them all.
    (
        "contract",
        0,
        (
            "registry",
            "registry.abc",
            "registry.errors",
            "registry.settings",
            "registry.environment",
            "registry.owner",
            "registry.usage",
        ),
    ),
    # Processes (identity, kill policy, refusal) and output as text (tail, hooks, the raw log
    # read and followed) rest on nothing else of the registry.
    ("proc", 1, ("registry.proc",)),
    ("output", 1, ("registry.output",)),
    # The state database and what the registry keeps in it.
    ("store", 2, ("registry.store",)),
    # The keeper, starting it, the session directory it shares, its output times.
    ("keeper", 3, ("registry.keeper",)),
    # The follower thread, heartbeat and watch events.
    ("live", 4, ("registry.live",)),
    # A session's life: spawn, stop, reconcile, finalize, owners, view, prune.
    ("lifecycle", 5, ("registry.lifecycle",)),
    ("process", 6, ("registry.process",)),
    ("fake", 6, ("registry.fake",)),
)

REGISTRY_FACES = frozenset(
    {
        "registry",
        "registry.abc",
        "registry.errors",
        "registry.settings",
        "registry.environment",
        "registry.owner",
        "registry.usage",
        "registry.process",
        "registry.fake",
        # Signalling a process known by identity (dispatch reload): the package's own face.
        "registry.proc",
        # The state database: every package registers its tables and opens the file with it.
        "registry.store.database",
        "registry.store.tables",
        "registry.store.backup",
    }
)
"""The registry modules code outside registry/ may import (tests may import anything): the
contract, its vocabulary and the two implementations; output is read through the contract."""


def test_registry_parts_import_downward_only() -> None:
    offenders = [
        line
        for path in sorted((ROOT / "registry").rglob("*.py"))
        for line in _layer_offenders(path, REGISTRY_LAYERS)
    ]
    assert not offenders, offenders


def test_outside_registry_only_its_public_faces_are_imported() -> None:
    offenders = []
    for package in ("dispatcher", "scope"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _imports_of(path):
                if name.split(".")[0] != "registry":
                    continue
                target = _existing_module(name)
                if target not in REGISTRY_FACES:
                    offenders.append(f"{path.relative_to(ROOT)} imports {target or name}")
    assert not offenders, f"import these through a public face ({sorted(REGISTRY_FACES)}): " + (
        ", ".join(offenders)
    )


def test_every_registry_part_and_face_names_real_modules() -> None:
    for layer, _, modules in REGISTRY_LAYERS:
        for module in modules:
            assert _existing_module(module) == module, f"{layer}: {module} does not exist"
    for face in REGISTRY_FACES:
        assert _existing_module(face) == face, f"{face} does not exist"
    parts = {p.name for p in (ROOT / "registry").iterdir() if (p / "__init__.py").is_file()}
    named = {m.split(".")[1] for _, _, ms in REGISTRY_LAYERS for m in ms if m.count(".") == 1}
    assert parts <= named, f"sub-packages in no layer: {sorted(parts - named)}"


@pytest.mark.parametrize(
    ("module", "source", "caught"),
    [
        ("registry.store.sessions", "from registry.lifecycle.view import Viewer\n", True),
        ("registry.output.log", "from ..proc.kill import stop_session\n", True),  # sideways
        ("registry.abc", "import registry.keeper.files\n", True),
        ("registry.fake", "from registry.process import ProcessRegistry\n", True),
        ("registry.keeper.times", "from registry.output.log import ArrivalTimes\n", False),
        ("registry.process", "from registry.lifecycle.spawn import Spawner\n", False),
    ],
)
def test_the_part_map_names_an_upward_import(module: str, source: str, caught: bool) -> None:
    package = module.rsplit(".", 1)[0]
    names = _module_names(source, package)
    assert bool(_import_offenders(REGISTRY_LAYERS, module, names, module)) is caught


# -- sizes -------------------------------------------------------------------------------------

MODULE_LINES = 600
FUNCTION_LINES = 80
ONE_SCRIPT = {"registry/keeper/program.py"}
"""The keeper must stay one file run with ``python3 -I -S`` (it cannot import our packages)."""


def test_modules_and_functions_stay_small() -> None:
    """No module over 600 lines (the keeper aside), no function over 80: past that a module
    holds more than one thing and a function cannot be read at once."""
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            source = path.read_text()
            lines = len(source.splitlines())
            if lines > MODULE_LINES and name not in ONE_SCRIPT:
                offenders.append(f"{name}: {lines} lines")
            for node in ast.walk(ast.parse(source, name)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > FUNCTION_LINES:
                        offenders.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert not offenders, offenders
