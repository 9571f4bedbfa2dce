#!/bin/sh
# pipeline.sh [--steps N] WORK - the whole model pipeline, end to end:
# corpus and tokenizer (prepare.py), training (train.py), export and golden
# files (golden.py), full-cache evaluation (evaluate.py), the generated block
# of models/README.md (report.py). Intermediate files go to WORK; the results
# to models/ and tests/fixtures/lm/. --steps overrides the configured step
# count (smoke runs; the files it writes are then not the committed ones).
set -e
steps=""
if [ "$1" = "--steps" ]; then steps=$2; shift 2; fi
[ $# -eq 1 ] || { echo "usage: pipeline.sh [--steps N] WORK" >&2; exit 2; }
work=$1
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
CFG=tools/train/config.json
export PYTHONPATH=tools/train
# Fixed thread count (reproducibility) and a glibc malloc that keeps its
# memory between steps instead of returning it to the system (mmap and trim
# thresholds raised, no mmap at all): about 1,400 -> 5,500 tokens/s here.
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296
export MALLOC_TOP_PAD_=536870912 MALLOC_MMAP_MAX_=0
mkdir -p "$work"
$PY tools/train/prepare.py $CFG models "$work"
$PY tools/train/train.py $CFG models "$work" ${steps:+"$steps"}
cp $CFG models/train-config.json
$PY tools/train/golden.py $CFG models "$work" tests/fixtures/lm
$PY tools/train/evaluate.py $CFG models "$work"
$PY tools/train/report.py $CFG models "$work"
