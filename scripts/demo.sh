#!/usr/bin/env bash
# Installs rlstab into .venv and runs the main job: `rlstab demo`, which RL-trains a tiny model on
# 2-digit addition with grpo and stapo side by side (a few minutes on a laptop CPU) and writes
# runs/demo/metrics.jsonl, curves.png and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[demo]"
.venv/bin/rlstab demo --out runs/demo
