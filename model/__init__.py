"""An exhaustive model check of Perago's publication protocol (docs/model-check.md).

``python -m model`` explores every interleaving of two attempts of one workflow step (the
second is Conductor's retry), Conductor, a foreign writer, lease expiry, the janitor and
crashes, and checks the invariants of ``model.invariants`` in every reachable state.

Modules, in the order the data flows: ``config`` (what a run explores), ``store`` (lakeFS),
``lease`` (the branch lease), ``conductor``, ``state`` (the global state), ``worker`` (one
attempt's steps, as the code takes them), ``actions`` (everything enabled in a state),
``invariants``, ``explore`` (breadth-first search), ``trace`` and ``report`` (output).
"""

from model.config import FIXES, MECHANISMS, Config
from model.explore import Counterexample, Result, explore

__all__ = ["FIXES", "MECHANISMS", "Config", "Counterexample", "Result", "explore"]
