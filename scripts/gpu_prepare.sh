#!/usr/bin/env bash
# Prepares, on a machine with internet, what a bare CUDA machine (Python 3.12, torch and Triton only, no
# network) needs to run scripts/gpu.sh: wheels of rlstab built from this checkout, of its other
# requirements (pydantic and its parts, einops, pyyaml), of pytest and hypothesis for the CUDA suite, and
# (unless --no-trainers) of veRL and Liger-Kernel, whose kernels the benchmark measures rlstab against
# (veRL's kernel files are loaded without the rest of veRL). Into .wheels/gpu (git-ignored; never
# committed), at most 64 MiB. Then copy the checkout, .wheels/gpu included, to the card and run
# `bash scripts/gpu.sh` there.
#
#   bash scripts/gpu_prepare.sh                     # for CPython 3.12 on x86-64 Linux
#   PYVER=3.11 bash scripts/gpu_prepare.sh --no-trainers
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python3.11 || command -v python3)
PYVER=${PYVER:-3.12}
DEST=.wheels/gpu
TRAINERS=1
[ "${1:-}" = "--no-trainers" ] && TRAINERS=0
rm -rf "$DEST" && mkdir -p "$DEST"
# The versions CI tests (scripts/test.sh installs the same ranges); pure-Python wheels except two.
PINS=(
    pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.15.0
    einops==0.8.2 pyyaml==6.0.3
    pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 hypothesis==6.170.17 sortedcontainers==2.4.0 attrs==26.1.0
)
[ "$TRAINERS" = 1 ] && PINS+=(verl==0.9.1 liger-kernel==0.8.5)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=(--platform "$p"); done
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${PLATFORMS[@]}" -d "$DEST" "${PINS[@]}"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$DEST" .
size=$(du -sk "$DEST" | cut -f1)
echo "$DEST: $(ls "$DEST" | wc -l) wheels, $((size / 1024)) MiB"
if [ "$size" -gt $((64 * 1024)) ]; then
    echo "scripts/gpu_prepare.sh: $DEST is over 64 MiB; try --no-trainers" >&2
    exit 1
fi
