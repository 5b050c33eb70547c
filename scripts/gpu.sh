#!/usr/bin/env bash
# The one command for a card: on a CUDA machine with torch and Triton (nothing else, no network needed),
# from a checkout holding the wheels of scripts/gpu_prepare.sh, runs the CUDA suite (`pytest -m cuda`,
# tests/cuda) and then benchmarks/gpu.py, and writes into $OUT (default gpu-results/): cuda-suite.log and
# .xml, gpu.log, gpu.json (the benchmark's tables) and gpu-run.json (one summary: the card, the versions,
# the suite's counts, the targets). Exit status: 0 when the suite passed and the benchmark ran without a
# crashed path; a FAIL target is a measured result, printed, not an error.
#
#   bash scripts/gpu.sh                  # the suite, then the full benchmark (about 2 + 2 minutes on an H200)
#   bash scripts/gpu.sh --quick          # the benchmark's --quick
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .wheels/gpu ]; then
    # Into a folder of its own, ahead of the machine's site-packages (which stay as they are); the checkout
    # goes first, so that the code that runs is the checkout's (the rlstab wheel brings its entry points).
    SITE=$(mktemp -d)
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$SITE" \
        .wheels/gpu/*.whl || { echo "scripts/gpu.sh: installing .wheels/gpu failed" >&2; exit 2; }
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" \
    || { echo "scripts/gpu.sh: torch sees no CUDA device here" >&2; exit 2; }
start=$SECONDS
timeout 600 "$PY" -m pytest -p no:cacheprovider -m cuda tests/cuda -rs --junitxml="$OUT/cuda-suite.xml" 2>&1 \
    | tee "$OUT/cuda-suite.log"
suite=${PIPESTATUS[0]}
suite_s=$((SECONDS - start))
start=$SECONDS
timeout 600 "$PY" benchmarks/gpu.py --out "$OUT/gpu.json" "$@" 2>&1 | tee "$OUT/gpu.log"
bench=${PIPESTATUS[0]}
"$PY" scripts/gpu_summary.py "$OUT" --suite-rc "$suite" --suite-s "$suite_s" --benchmark-rc "$bench" \
    --benchmark-s $((SECONDS - start))
[ "$suite" = 0 ] && [ "$bench" = 0 ]
