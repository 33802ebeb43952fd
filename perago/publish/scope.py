"""Publication scopes: which part of a branch one step writes, and who may publish beside it.

A writable task's *scope* is its rendered prefix. Two scopes overlap when one is a
path-segment prefix of the other (``a/`` and ``a/b/`` overlap, ``a/`` and ``ab/`` do not).
Publications of disjoint scopes from one input ref may all land (a fan-out); overlapping
ones keep the single-writer rules. Pure functions only: the publisher and the fences decide
with them, the model check mirrors them.
"""

from __future__ import annotations

import functools
import hashlib

from perago.core import lakefs_names as names

__all__ = [
    "SCOPE_MARKER_ROOT",
    "overlaps",
    "scope_markers",
]

SCOPE_MARKER_ROOT = names.SCOPE_MARKER_ROOT


@functools.lru_cache(maxsize=65_536)  # a fan-out's fences compare the same scopes again
def _segments(scope: str) -> tuple[str, ...]:
    return tuple(p for p in scope.split("/") if p)


def overlaps(a: str | None, b: str | None) -> bool:
    """Whether two scopes overlap; an unknown scope (``None``) overlaps everything."""
    if a is None or b is None:
        return True
    sa, sb = _segments(a), _segments(b)
    n = min(len(sa), len(sb))
    return sa[:n] == sb[:n]


def _marker_path(input_ref: str, scope: str) -> str:
    return f"{SCOPE_MARKER_ROOT}{input_ref}/{scope}@"


def scope_markers(input_ref: str, scope: str, claim: bytes) -> dict[str, bytes]:
    """The marker objects a publication of ``scope`` from ``input_ref`` writes.

    They make lakeFS's atomic 3-way merge reject the second of two *overlapping*
    publications from one input ref and accept *disjoint* ones:

    - the scope's own marker gets ``claim`` (unique per attempt): two publications of one
      scope change it differently, a conflict;
    - every proper ancestor's marker (the root included) gets the same fixed "intent" bytes:
      disjoint siblings make identical changes there (no conflict), while a publication
      of that ancestor scope writes its own claim there (a conflict).

    The markers sit under the input ref's own folder, so publications from different input
    refs never touch the same marker (no false conflicts in a serial chain or an unpinned
    fan-out); those are told apart by the publish fence and the expected-head hook instead.
    """
    segments = _segments(scope)
    own = "/".join(segments) + "/" if segments else ""
    markers = {_marker_path(input_ref, own): claim}
    intent = b"intent " + hashlib.sha256(input_ref.encode()).hexdigest().encode()
    for n in range(len(segments)):
        ancestor = "/".join(segments[:n]) + "/" if n else ""
        markers[_marker_path(input_ref, ancestor)] = intent
    return markers
