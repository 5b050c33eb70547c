#!/usr/bin/env bash
# Installs everything into .venv-test and runs every test, then builds the docs strictly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
[ -x .venv-test/bin/python ] || "$PY" -m venv .venv-test
.venv-test/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-test/bin/pip install -q --disable-pip-version-check -e ".[test,docs]"
echo "== core tests"
.venv-test/bin/python -m pytest -p no:cacheprovider
echo "== docs"
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv-test/bin/mkdocs build --strict --quiet -d "$site"
rm -rf "$site"
echo "docs: built with --strict"
