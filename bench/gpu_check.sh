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
# GPU_PART=default (issue 48, its own command): the default-path row (`shoestring train` with
# no configuration beyond the model size and a budget), the equal-wall-clock quality row
# against the careful HF user (GPU_QUALITY_SECONDS each side, default 120) and the
# hand-configured mlm-base row, on the wiki-books slice `make gpu-data` prepares here and the
# device command carries (.gpu-data/; GPU_DATA); refused (exit 2) when the slice is missing.
# GPU_PART=planner (issue 51, its own command): the calibrated planner's check on one device,
# `plan --calibrate` at a wall-clock budget (GPU_PLANNER_BUDGET, default 5m: calibration
# included; GPU_PLANNER_FLAGS=--curves for learning curves) on the same slice, `train --plan`,
# then `eval`, which sets the plan's predicted
# held-out loss and interval beside the achieved one (planner.log, plan.yaml, eval.json).
# GPU_PART=serve (issue 49, its own command): the mlm-cram shape, then its /v1/embed served
# by 1, 2 and 4 replicas at 32 and 256 clients against the engine's offline ceiling, with
# the server's stage breakdown (gpu-serve.json, .md, .jsonl, .log); needs no data.
# GPU_PART=rtd (issue 60, its own command): replaced-token detection against MLM at BERT-base
# size, each pretrained for the same wall clock (GPU_RTD_BUDGET, default 120s) on the slice,
# held-out metrics each, then fine-tuned on SST-2 (the slice's glue/, `make gpu-data`) beside
# their random twin (gpu-rtd.json, .md via the log, .jsonl, .log).
# Exit status: non-zero when the tests or the benchmark failed (both always run); 2 when
# something the command needs did not travel.
set -u
cd "$(dirname "$0")/.."
WHEELS=${GPU_WHEELS_DIR:-.gpu-wheels}
SITE=${GPU_SITE:-/tmp/shoestring-gpu-site}
OUTDIR=${GPU_OUT:-${OUT:-runs/gpu-check}}
SECONDS_EACH=${GPU_SECONDS:-10}
PART=${GPU_PART:-all}
PY=${GPU_PYTHON:-python3}
DATA=${GPU_DATA:-.gpu-data/wiki-books-32k}
QUALITY_SECONDS=${GPU_QUALITY_SECONDS:-120}

PLANNER_BUDGET=${GPU_PLANNER_BUDGET:-5m}
RTD_BUDGET=${GPU_RTD_BUDGET:-120s}
GLUE=${GPU_GLUE:-$(dirname "$DATA")/glue}
PLANNER_FLAGS=${GPU_PLANNER_FLAGS:-}  # e.g. --curves: calibrate on learning curves

case "$PART" in all|tests|bench|default|planner|serve|rtd) ;;
  *) echo "GPU_PART=$PART: choose tests, bench, default, planner, serve, rtd or all (docs/gpu.md)" >&2
     exit 2 ;;
esac
if { [ "$PART" = default ] || [ "$PART" = planner ] || [ "$PART" = rtd ]; } &&
   { [ ! -f "$DATA/manifest.json" ] || { [ "$PART" = rtd ] && [ ! -f "$GLUE/SST-2/dev.tsv" ]; }; }; then
  echo "no prepared data at $DATA/ (GPU_PART=$PART trains on the wiki-books slice): run" \
       "'make gpu-data PYTHON=.venv/bin/python' where the shared corpus is, then carry it:" \
       "run(command=\"make gpu-check GPU_PART=$PART\", carry=[\".gpu-wheels\"," \
       "\".gpu-data\"], timeout_s=600) (docs/gpu.md)" >&2
  exit 2
fi
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
if [ "$PART" = default ]; then
  # The quality row first after the default run (its own CLI process), the hand-configured
  # mlm-base row last, on the same data; each row is saved as it finishes (docs/gpu.md).
  "$PY" bench/gpu.py --only default,quality,mlm-base --data "$DATA" --mlm-base-data "$DATA" \
    --quality-seconds "$QUALITY_SECONDS" --seconds "$SECONDS_EACH" --no-serve \
    --out "$OUTDIR/gpu-default.json" --table "$OUTDIR/gpu-default.md" \
    --record "$OUTDIR/gpu-default.jsonl" --work /tmp/shoestring-gpu-work 2>&1 \
    | tee "$OUTDIR/gpu-default.log"
  bench_rc=$?
fi
if [ "$PART" = serve ]; then
  # Issue 49: the mlm-cram shape trained (its serving needs the run), then /v1/embed served
  # with 1, 2 and 4 replicas at 32 and 256 clients against the engine's offline ceiling.
  "$PY" bench/gpu.py --only mlm-cram --serve-workers 1 2 4 --seconds "$SECONDS_EACH" \
    --out "$OUTDIR/gpu-serve.json" --table "$OUTDIR/gpu-serve.md" \
    --record "$OUTDIR/gpu-serve.jsonl" --work /tmp/shoestring-gpu-work 2>&1 \
    | tee "$OUTDIR/gpu-serve.log"
  bench_rc=$?
fi
if [ "$PART" = planner ]; then
  # wall-clock budget: measuring, calibrating and fitting are paid from it (docs/planning.md)
  {
    "$PY" -m shoestring plan --hardware auto --measure --budget "$PLANNER_BUDGET" \
      --data "$DATA" --calibrate $PLANNER_FLAGS \
      --calibration-dir /tmp/shoestring-gpu-work/calibration \
      -o "$OUTDIR/plan.yaml" &&
    "$PY" -m shoestring train --data "$DATA" --plan "$OUTDIR/plan.yaml" \
      -o /tmp/shoestring-gpu-work/planned --overwrite &&
    "$PY" -m shoestring eval /tmp/shoestring-gpu-work/planned &&
    cp /tmp/shoestring-gpu-work/planned/eval.json /tmp/shoestring-gpu-work/planned/summary.json \
      "$OUTDIR/"
  } 2>&1 | tee "$OUTDIR/planner.log"
  bench_rc=$?
fi
if [ "$PART" = rtd ]; then
  # Issue 60: the same wall clock each, one after the other on the card; held-out metrics
  # (eval.json), then SST-2 fine-tuned from each and from random init, paired by seed.
  "$PY" bench/objective_transfer.py --data "$DATA" --glue "$GLUE" --preset base \
    --budget "$RTD_BUDGET" --arms mlm,rtd --pretrain-seeds 1 --seeds 2 --tasks sst2 \
    --max-train 2000 --parallel 1 --work /tmp/shoestring-gpu-work/rtd \
    --ledger "$OUTDIR/rtd-ledger" --out "$OUTDIR/gpu-rtd.json" --record "$OUTDIR/gpu-rtd.jsonl" 2>&1 \
    | tee "$OUTDIR/gpu-rtd.log"
  bench_rc=$?
fi
echo "cuda tests exit $tests_rc, benchmark exit $bench_rc; results in $OUTDIR"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
