"""The production-install tier: this checkout as a deployment installs it.

:func:`install_from_checkout` builds a wheel from a copy of the checkout's packaging inputs (so
nothing is written into the source tree), creates a fresh venv with no access to the dev
environment and installs the wheel there **without extras**, then runs ``pip check``.
:class:`Installed` runs that venv's ``bin/dispatch`` in a clean environment (no ``PYTHONPATH``,
no ``DISPATCH_*`` variables, ``HOME`` and the XDG dirs in the test's own directory) from a
working directory outside the source tree, so what is tested is what ``pip install dispatch``
gives a user.

Speed (the whole tier should take well under a minute): the wheel is built with this venv's
build backend (``--no-build-isolation``; the dev extra declares the same setuptools as
``[build-system]``) when it is new enough, in an isolated build otherwise; the venv is created
without pip and installed into by this venv's pip (``pip --python``); the runtime dependencies
come from a wheelhouse kept in ``$XDG_CACHE_HOME/dispatch-tests/wheelhouse`` (``--no-index
--find-links``), filled through the ordinary index with ``pip wheel`` when it lacks what the
requirements ask for (a fresh machine, a changed requirement) or is older than a week.

Without pip or venv here the tier skips with the reason; ``DISPATCH_REQUIRE_INSTALL=1`` (CI)
turns that into a failure. A build, install or ``pip check`` that fails is always a failure:
that is what the tier is for.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Set to ``1`` to turn "cannot build or install here" from a skip into a failure (CI).
ENV_REQUIRE = "DISPATCH_REQUIRE_INSTALL"
PACKAGES = ("dispatcher", "registry", "scope")
#: What setuptools needs besides the packages to build the wheel.
BUILD_INPUTS = ("pyproject.toml", "README.md")
WHEELHOUSE_MAX_AGE = 7 * 86400.0
#: Variables a unit or command of the tier must not inherit from the developer's session.
FOREIGN = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "VIRTUAL_ENV",
    "DISPATCH_CONFIG",
    "DISPATCH_STATE_DIR",
    "DISPATCH_DATABASE_URL",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
)

_SUMMARY = pytest.StashKey[str]()


def require_install() -> bool:
    """Whether a tier that cannot run must fail (``DISPATCH_REQUIRE_INSTALL=1``)."""
    return os.environ.get(ENV_REQUIRE, "") == "1"


class InstallUnavailable(Exception):
    """This machine cannot build or install a venv at all (no pip, no venv module)."""


class InstallFailed(AssertionError):
    """Building, installing or checking the package failed: a defect of the package."""


def _pip(*args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path.home() if Path.home().is_dir() else "/",
        timeout=timeout,
        check=False,
    )


def _checked(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        tail = (done.stdout[-3000:] + done.stderr[-3000:]).strip()
        raise InstallFailed(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _backend_is_current() -> bool:
    """Whether this venv's setuptools meets ``[build-system].requires`` (>= 77)."""
    try:
        import setuptools
    except ImportError:
        return False
    major = setuptools.__version__.split(".")[0]
    return major.isdigit() and int(major) >= 77


def build_wheel(dest: Path) -> Path:
    """Build the wheel from a copy of the packaging inputs into ``dest``; its path."""
    source = dest / "source"
    source.mkdir(parents=True)
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    args = ["wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(source)]
    if _backend_is_current():
        args.insert(1, "--no-build-isolation")
    _checked(_pip(*args), "pip wheel of the checkout")
    (wheel,) = dest.glob("dispatch-*.whl")
    return wheel


def wheelhouse() -> Path:
    """The cache of runtime-dependency wheels shared by runs on this machine."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dispatch-tests" / "wheelhouse"


def install_wheel(wheel: Path, venv: Path) -> str:
    """A fresh venv at ``venv`` with ``wheel`` and its runtime requirements, no extras;
    returns how the requirements were found (for the summary). ``pip check`` is
    :func:`pip_check`."""
    try:
        import venv as _venv  # noqa: F401 - only to know that venvs can be made here
    except ImportError as exc:
        raise InstallUnavailable(f"no venv module: {exc}") from exc
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    _checked(made, "python -m venv")
    python = str(venv / "bin" / "python")
    house = wheelhouse()
    house.mkdir(parents=True, exist_ok=True)
    stamp = house / ".filled"
    offline = ["--python", python, "install", "--quiet", "--no-index", "--find-links", str(house)]
    how = "cached wheelhouse"
    # Test runs on one machine share the wheelhouse: one fills it while the others wait.
    with open(house / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < WHEELHOUSE_MAX_AGE
        if not fresh or _pip(*offline, str(wheel)).returncode != 0:
            # Filled the way a deployment resolves: the ordinary index, latest versions.
            _checked(_pip("wheel", "--quiet", "--wheel-dir", str(house), str(wheel)), "pip wheel")
            for ours in house.glob("dispatch-*.whl"):
                ours.unlink()
            stamp.touch()
            _checked(_pip(*offline, str(wheel)), "pip install of the wheel")
            how = "wheelhouse filled from the index"
    return how


def pip_check(venv: Path) -> str:
    """``pip check`` of the venv's installed distributions; its report."""
    return _checked(_pip("--python", str(venv / "bin" / "python"), "check"), "pip check")


def wheel_names(wheel: Path) -> set[str]:
    """The paths inside a wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@dataclass
class Installed:
    """A venv holding this checkout's wheel (see the module docstring)."""

    venv: Path
    wheel: Path
    build_seconds: float = 0.0
    install_seconds: float = 0.0
    how: str = ""
    _site: str = field(default="", repr=False)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def program(self) -> str:
        """The console script a user runs."""
        return str(self.bin / "dispatch")

    @property
    def python(self) -> str:
        return str(self.bin / "python")

    def env(self, home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment for a user whose home is ``home``: ``base`` (a systemd
        manager's env, say) less anything pointing at the dev setup, PATH with the venv first,
        and the XDG dirs inside ``home`` (so the default config and state dir are there)."""
        env = {k: v for k, v in (base or os.environ).items() if k not in FOREIGN}
        env.pop("PYTEST_CURRENT_TEST", None)
        env.update(
            HOME=str(home),
            PATH=f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_STATE_HOME=str(home / ".local" / "state"),
        )
        return env

    def unit_env(self, home: Path) -> dict[str, str]:
        """What a unit of the tier gets besides the manager's bus variables."""
        return {
            "HOME": str(home),
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
        }

    @staticmethod
    def unit_properties(**extra: str) -> dict[str, str]:
        """Unit properties: nothing the manager itself inherited reaches the unit."""
        return {"UnsetEnvironment": " ".join(FOREIGN), **extra}

    def run(
        self,
        env: Mapping[str, str],
        *args: str,
        cwd: Path,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """``bin/dispatch ARGS`` in ``env`` from ``cwd``; with ``check`` a non-zero exit fails
        with its output."""
        done = subprocess.run(
            [self.program, *args],
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"dispatch {' '.join(args)}: exit {done.returncode}\n"
                f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
            )
        return done

    def site_packages(self) -> str:
        """The venv's site-packages directory, as its own interpreter names it."""
        if not self._site:
            done = subprocess.run(
                [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                env={"PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            self._site = done.stdout.strip()
        return self._site


def install_from_checkout(root: Path, config: pytest.Config) -> Installed:
    """Build and install (see the module docstring); skips or fails when it cannot."""
    try:
        begun = time.monotonic()
        wheel = build_wheel(root / "build")
        built = time.monotonic()
        how = install_wheel(wheel, root / "venv")
    except InstallUnavailable as exc:
        config.stash[_SUMMARY] = f"unavailable ({exc})"
        if require_install():
            pytest.fail(f"{ENV_REQUIRE}=1 but no venv can be installed: {exc}", pytrace=False)
        pytest.skip(f"cannot install a venv here: {exc}")
    done = time.monotonic()
    installed = Installed(
        venv=root / "venv",
        wheel=wheel,
        build_seconds=built - begun,
        install_seconds=done - built,
        how=how,
    )
    config.stash[_SUMMARY] = (
        f"{wheel.name} built in {installed.build_seconds:.1f} s, installed without extras in "
        f"{installed.install_seconds:.1f} s ({how})"
    )
    return installed


def summary_line(config: pytest.Config) -> str:
    """One line for the terminal summary: the wheel the tier tested, or why none."""
    return "install tier: " + config.stash.get(_SUMMARY, "not used in this run")
