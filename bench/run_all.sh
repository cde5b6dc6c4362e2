#!/usr/bin/env bash
# The full benchmark run: every bench command, then README's Performance section. Its arguments are cut to what one
# hour on 2 cores holds (issue 24: under 60 minutes): verify_cost at 2 threads on the four random GPT-2 shapes,
# speedup on the pairs and the gammas and acceptances issue 24's targets name (and gpt2's, for its plain decoding)
# at gammas 3 and 4 (gamma 2 was never the fastest for these pairs in intel3/, and each speculative run is now paired
# with a plain one, which costs about five minutes), drafters at gammas 3 and 4 and trees at a = 0.7, verification on 8 prompts x 2 seeds, quantized at half its sample sizes; each
# command's own defaults
# (`python -m bench.NAME`) still run the wider sweeps. bench/results/ (not earlier/) was written by the longer run
# before this cut (100 minutes on the Intel machine of bench/results/README.md); bench/results/issue24/intel/run_all/
# by this cut with quantized's full samples (60 min 55 s, 12.5 of them quantized's, 7.2 at half samples: about
# 55.6 minutes in all; issue24/README.md, section `intel/`, has each command's time); bench/results/issue24/intel2/
# run_all/ by this script as it stands, in 58 min 59 s on a slower host (section `intel2/`).
# Run it on a quiet machine: the results record the 1-minute load average at the start of each command,
# and this script prints when each command starts, so the log tells what took how long.
# `bench/run_all.sh OUT` writes every table into the folder OUT instead (created if missing) and leaves
# README.md alone: `python -m bench.report --results OUT` then points README's Performance section at that run.
set -euo pipefail
if [ $# -gt 1 ]; then echo "run_all: takes at most one argument, the output folder; got $#" >&2; exit 2; fi
out=()
if [ $# -eq 1 ]; then out=(--out "$(realpath -m -- "$1")"); fi   # resolved before the cd below
cd "$(dirname "$0")/.."
step() { echo "run_all: $(date -u +%H:%M:%S) python -m $* ${out[*]:-}" >&2; python -m "$@" "${out[@]}"; }
step bench.verify_cost --max-m 16 --threads 2 --models random:distilgpt2,random:gpt2,random:gpt2-medium,random:gpt2-large
step bench.panels
step bench.speedup --pairs gpt2-large/distilgpt2,gpt2-medium/distilgpt2,gpt2/distilgpt2 --gammas 3,4 --a 0.7,0.9
step bench.compare
step bench.drafters --repeats 1 --a 0.7 --gammas 3,4
step bench.trees --repeats 1 --a 0.7
step bench.verification --prompts 8 --seeds 2
step bench.sweep
step bench.memory
step bench.load
step bench.profile
step bench.threads
step bench.quantized --windows 24 --starts 48 --seeds 2
step bench.qspeed --repeats 3
step bench.primitives --repeats 3
if [ ${#out[@]} -eq 0 ]; then step bench.report --results bench/results; fi   # README then quotes this run
echo "run_all: $(date -u +%H:%M:%S) done" >&2
