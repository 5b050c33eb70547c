#!/usr/bin/env bash
# Installs rlstab into .venv and runs the main job: what the stapo objective is and what it does on a batch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[demo]"
.venv/bin/rlstab explain stapo
echo
.venv/bin/python examples/loss_example.py
