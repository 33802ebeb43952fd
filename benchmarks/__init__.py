"""Benchmarks: Perago against ``lakectl local`` and a bare conductor-python worker.

``python -m benchmarks.run [--quick]`` measures everything against one running stack and
writes ``benchmarks/results.json``; ``docs/benchmarks.md`` explains the scenarios.

Modules:

- ``common``: the stack's environment, deterministic test trees, timed subprocesses.
- ``scenario``: the Perago side of one data scenario, run as its own process so that its
  peak RSS (``ru_maxrss``) belongs to that scenario alone.
- ``roundtrip``: a no-op task end to end through Conductor, Perago worker vs bare worker.
- ``run``: the driver, the table and ``results.json``.
"""
