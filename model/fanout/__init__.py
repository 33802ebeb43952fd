"""The fan-out model check: parallel writers of one branch (issue 12, docs/model-check.md).

``python -m model.fanout`` explores every interleaving of three writing steps of one
workflow that fork from one input ref r0: A (scope ``a/``) and B (``b/``) are disjoint, C
(``a/x/``) overlaps A. Each step has Conductor retries; around them run Conductor
(polls, response timeouts), a foreign writer, lease expiry (a paused or dead holder), the
janitor and crashes after any step. It checks the fan-out invariants of
``model.fanout.invariants`` in every reachable state.

Kept apart from the serial model (``model``) because the state differs (several steps,
trees with scope markers and data, reverts): both share the explorer and the lease.
Modules: ``config``, ``tree`` (lakeFS commits, 3-way merge, revert), ``state``, ``worker``
(one attempt's steps, as ``perago/publish/transaction.py`` takes them), ``reads`` (named
inputs and the serializable read-set check, run by ``python -m model.reads``), ``actions``,
``invariants``, ``report``.
"""

from model.fanout.config import MECHANISMS, STEPS, FanoutConfig

__all__ = ["MECHANISMS", "STEPS", "FanoutConfig"]
