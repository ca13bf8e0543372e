"""Benchmarks and scale studies: scripts that measure the runner and write JSON (numbers are
never asserted in tests; docs/RESULTS.md quotes them). ``harness.py`` is what they share: the
machine record, real training jobs on real ranks, the JSON and markdown they write.

Run one from the repository root, e.g. ``python benchmarks/bench_sim.py --quick``.
"""
