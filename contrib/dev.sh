#!/bin/sh
# Newcomer entry point: sets up ./.venv (again whenever pyproject.toml changes), then runs a task.
#   sh contrib/dev.sh demo   run the gateway demo on the embedded default (SQLite state dir)
#   sh contrib/dev.sh test   ruff, mypy and the whole test suite (extra args go to pytest)
set -eu
cd "$(dirname "$0")/.."

VENV=${DISPATCH_VENV:-.venv}

pick_python() {
    for candidate in ${PYTHON:-} python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "dev.sh: need Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
    return 1
}

setup() {
    want=$(cat pyproject.toml | cksum)
    if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.dev-stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    python=$(pick_python)
    echo "dev.sh: preparing $VENV with $python ..." >&2
    "$python" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
    echo "$want" >"$VENV/.dev-stamp"
}

task=${1:-}
[ $# -gt 0 ] && shift
case "$task" in
demo)
    setup
    exec "$VENV/bin/python" contrib/demo.py "$@"
    ;;
test)
    setup
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"
    exec "$VENV/bin/python" -m pytest "$@"
    ;;
*)
    echo "usage: sh contrib/dev.sh demo|test [args...]" >&2
    exit 2
    ;;
esac
