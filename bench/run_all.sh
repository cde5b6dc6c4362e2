#!/usr/bin/env bash
# The full benchmark run that produced bench/results/, then README's section (about 100 minutes on 2 cores of the
# Intel machine of bench/results/README.md; on an AMD Zen 4 with the fast extra, its first command, verify_cost,
# had not finished after 24 minutes: it was stopped there, inside gpt2-medium, before gpt2-large).
# Run it on a quiet machine: the results record the 1-minute load average at the start of each command,
# and this script prints when each command starts, so the log tells what took how long.
# `bench/run_all.sh OUT` writes every table into the folder OUT instead (created if missing) and leaves
# README.md alone: bench.report rewrites README's section from bench/results/ only.
set -euo pipefail
if [ $# -gt 1 ]; then echo "run_all: takes at most one argument, the output folder; got $#" >&2; exit 2; fi
out=()
if [ $# -eq 1 ]; then out=(--out "$(realpath -m -- "$1")"); fi   # resolved before the cd below
cd "$(dirname "$0")/.."
step() { echo "run_all: $(date -u +%H:%M:%S) python -m $* ${out[*]:-}" >&2; python -m "$@" "${out[@]}"; }
step bench.verify_cost --max-m 16
step bench.panels
step bench.speedup
step bench.compare
step bench.drafters --repeats 1
step bench.trees --repeats 1
step bench.verification
step bench.sweep
step bench.memory
step bench.load
step bench.profile
step bench.threads
step bench.quantized
step bench.qspeed
step bench.primitives
if [ ${#out[@]} -eq 0 ]; then step bench.report; fi
echo "run_all: $(date -u +%H:%M:%S) done" >&2
