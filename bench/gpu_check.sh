#!/usr/bin/env bash
# The GPU check (docs/gpu.md), run on the lent GPU machine from the repository root:
#   1. install the carried wheels (.gpu-wheels/, from `make gpu-wheels`) into a side folder
#      on PYTHONPATH; --no-deps: the machine's own torch, transformers, ... are used as they are
#   2. the `cuda`-marked tests (tests/test_cuda.py), log + JUnit XML
#   3. the GPU benchmark (bench/gpu.py), JSON + markdown table + its bench record (JSONL)
# Everything lands in $GPU_OUT (default: the device tool's $OUT, else runs/gpu-check), at most
# two folders down and under 8 files, so the device tool brings all of it back.
# GPU_PART=tests or GPU_PART=bench runs one of the two (each fits one 10-minute device
# command; both together may not); default: both. GPU_SECONDS: steady seconds per bench side.
# Exit status: non-zero when the tests or the benchmark failed (both always run).
set -u
cd "$(dirname "$0")/.."
WHEELS=${GPU_WHEELS_DIR:-.gpu-wheels}
SITE=${GPU_SITE:-/tmp/shoestring-gpu-site}
OUTDIR=${GPU_OUT:-${OUT:-runs/gpu-check}}
SECONDS_EACH=${GPU_SECONDS:-10}
PART=${GPU_PART:-all}
PY=${GPU_PYTHON:-python3}

if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "no wheels in $WHEELS/: run 'make gpu-wheels' where pip can download, and carry" \
       "the folder (docs/gpu.md)" >&2
  exit 2
fi
mkdir -p "$OUTDIR"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl || exit 2
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  echo "== $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import torch, transformers as t; print("torch", torch.__version__,
    "cuda", torch.version.cuda, "transformers", t.__version__)'
} 2>&1 | tee "$OUTDIR/machine.txt"

set -o pipefail
tests_rc=0
bench_rc=0
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  "$PY" -m pytest tests/test_cuda.py -m cuda -v -rs -p no:cacheprovider --durations=0 \
    --junitxml="$OUTDIR/cuda-tests.xml" 2>&1 | tee "$OUTDIR/cuda-tests.log"
  tests_rc=$?
fi
if [ "$PART" = all ] || [ "$PART" = bench ]; then
  "$PY" bench/gpu.py --seconds "$SECONDS_EACH" --out "$OUTDIR/gpu-bench.json" \
    --table "$OUTDIR/gpu-bench.md" --record "$OUTDIR/gpu-bench.jsonl" \
    --work /tmp/shoestring-gpu-work 2>&1 \
    | tee "$OUTDIR/gpu-bench.log"
  bench_rc=$?
fi
echo "cuda tests exit $tests_rc, benchmark exit $bench_rc; results in $OUTDIR"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
