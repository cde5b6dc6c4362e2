#!/usr/bin/env bash
# The full benchmark run that produced bench/results/, then README's section (about 100 minutes on 2 cores).
# Run it on a quiet machine: the results record the 1-minute load average at the start of each command,
# and this script prints when each command starts, so the log tells what took how long.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "run_all: $(date -u +%H:%M:%S) python -m $*" >&2; python -m "$@"; }
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
step bench.report
echo "run_all: $(date -u +%H:%M:%S) done" >&2
