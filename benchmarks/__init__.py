"""agentrt's benchmarks: a few suites, each answering one question (benchmarks/_suites.py),
run only as this package:

    python -m benchmarks list                     # the suites, their question and parts
    python -m benchmarks cost                     # a suite (its default part)
    python -m benchmarks cost http --rounds 2     # or one part, with its options
    python -m benchmarks cost http --help         # a part's options
    python -m benchmarks index                    # rewrite results/README.md

Not part of the installed package: they need this checkout (its results/, traces,
engines).
"""
