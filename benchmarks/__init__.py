"""agentrt's benchmarks: a few suites, each answering one question (benchmarks/_suites.py).

    python -m benchmarks list                 # the suites, their question and entries
    python -m benchmarks cost                 # run a suite's main entry
    python -m benchmarks cost http_latency --rounds 2    # or one entry, with its options
    python -m benchmarks index                # rewrite results/README.md

Each entry is also a script of its own (``python benchmarks/NAME.py --help``). Not part of
the installed package: they need this checkout (its results/, traces, engines).
"""
