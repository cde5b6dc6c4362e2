"""npspec's benchmarks: each module is a command writing CSV + a Markdown table (+ PNG plots).

    python -m bench.verify_cost   # time of one cached forward over M = 1..16 new tokens, per kernel and layout
    python -m bench.speedup       # AR vs speculative tok/s: the shipped pair, controlled acceptance on GPT-2 shapes
    python -m bench.sweep         # acceptance against gamma and temperature on the shipped pair
    python -m bench.memory        # load time and peak RSS of a converted gpt2-large
    python -m bench.profile       # where a gpt2-large forward's time goes (cProfile)
    python -m bench.threads       # what a thread handoff and OpenBLAS' spinning threads cost
    python -m bench.report        # README's Performance section and bench/results/README.md from one run (--results)

Every measuring command takes --quick, --out and --threads (bench.common.command_line). Full runs
write to bench/results/latest/ (bench/results/ holds the committed runs, a folder each). `--quick` runs a
small version in under 3 minutes and writes to a new temporary folder (or --out), never over the committed
results. --threads sets
both the BLAS pools (threadpoolctl) and the panel kernels' threads of the models a
command builds; nothing is global. Speed targets live here as benchmarks, never as timed
assertions in tests.
"""
