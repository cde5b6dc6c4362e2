#!/usr/bin/env bash
# The full benchmark run that produced bench/results/ (about an hour on 2 cores), then README's section.
# Run it on a quiet machine: the results record the 1-minute load average at the start of each command.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m bench.verify_cost
python -m bench.speedup
python -m bench.compare
python -m bench.drafters
python -m bench.trees
python -m bench.sweep
python -m bench.memory
python -m bench.load
python -m bench.profile
python -m bench.threads
python -m bench.quantized
python -m bench.qspeed
python -m bench.report
