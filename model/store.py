"""lakeFS as the model sees it: an immutable commit graph, one target branch, tags.

Only what the protocol's decisions depend on is kept: parents, who published a commit (the
identity in its metadata), which input ref it was published from, and the content of the
publication marker. Task data is abstracted away: publications and foreign commits never
conflict on data, the worst case for the protocol (a data conflict only makes a merge fail).

Commit ids are slot numbers fixed by the configuration (root, foreign commit, one staged and
one merge commit per attempt), so two runs that build the same graph build equal states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

__all__ = [
    "FOREIGN",
    "NO_REF",
    "ROOT",
    "Commit",
    "MergeOutcome",
    "add_commit",
    "commit_name",
    "first_parent_history",
    "merge",
    "merge_base",
    "merge_slot",
    "reachable",
    "staged_slot",
]

NO_REF = -1
ROOT = 0  # the initial head: the input ref of the step (pinned or read from the head)
FOREIGN = 1  # the foreign writer's commit


class Node(Protocol):
    """What the graph walks need of a commit (this model's, or the fan-out model's)."""

    @property
    def parents(self) -> tuple[int, ...]: ...

    @property
    def ancestors(self) -> int: ...


class Commit(NamedTuple):
    parents: tuple[int, ...]
    kind: str  # "root", "foreign", "staged", "merge"
    owner: int  # attempt slot named in the metadata; NO_REF: not a Perago publication
    input_ref: int  # perago.input_ref of the metadata; NO_REF if none
    marker: int  # attempt slot written into the publication marker; NO_REF: never written
    ancestors: int  # bitmask of every ancestor, itself included
    first_parents: int  # bitmask of its first-parent chain, itself included


def staged_slot(attempt: int) -> int:
    return 2 + 2 * attempt


def merge_slot(attempt: int) -> int:
    return 3 + 2 * attempt


def commit_name(ref: int, attempt_name: str) -> str:
    """``r0``, ``F``, ``S[A]`` (staged by attempt A), ``M[A]`` (merged by A)."""
    if ref == ROOT:
        return "r0"
    if ref == FOREIGN:
        return "F"
    if ref == NO_REF:
        return "-"
    return f"{'S' if ref % 2 == 0 else 'M'}[{attempt_name}]"


def add_commit(
    commits: tuple[Commit | None, ...],
    ref: int,
    parents: tuple[int, ...],
    *,
    kind: str,
    owner: int = NO_REF,
    input_ref: int = NO_REF,
    marker: int,
) -> tuple[Commit | None, ...]:
    anc = 1 << ref
    for p in parents:
        parent = commits[p]
        assert parent is not None
        anc |= parent.ancestors
    first = commits[parents[0]]
    assert first is not None
    commit = Commit(parents, kind, owner, input_ref, marker, anc, (1 << ref) | first.first_parents)
    return (*commits[:ref], commit, *commits[ref + 1 :])


def first_parent_history(commits: Sequence[Node | None], head: int) -> list[int]:
    """Head first: the publication history of the branch (``log --first-parent``)."""
    out = []
    ref = head
    while True:
        out.append(ref)
        commit = commits[ref]
        assert commit is not None
        if not commit.parents:
            return out
        ref = commit.parents[0]


def reachable(commits: Sequence[Node | None], refs: int) -> int:
    """Bitmask of every commit reachable from the commits in the bitmask ``refs``."""
    out = 0
    ref = 0
    while refs >> ref:
        if refs >> ref & 1:
            commit = commits[ref]
            assert commit is not None
            out |= commit.ancestors
        ref += 1
    return out


def merge_base(commits: tuple[Commit | None, ...], a: int, b: int) -> int:
    """A best common ancestor (none of the others descends from it); the lowest id if several."""
    ca, cb = commits[a], commits[b]
    assert ca is not None and cb is not None
    common = ca.ancestors & cb.ancestors
    best = []
    for ref in range(len(commits)):
        if not common >> ref & 1:
            continue
        others = common & ~(1 << ref)
        descends = False
        for other in range(len(commits)):
            if others >> other & 1:
                oc = commits[other]
                assert oc is not None
                if oc.ancestors >> ref & 1:
                    descends = True
                    break
        if not descends:
            best.append(ref)
    return best[0]


class MergeOutcome(NamedTuple):
    commits: tuple[Commit | None, ...]
    head: int  # NO_REF when the merge was rejected
    error: str  # why lakeFS rejected it ("" on success)


def merge(
    commits: tuple[Commit | None, ...],
    head: int,
    source: int,
    into: int,
    *,
    owner: int,
    input_ref: int,
    expected_head: int,
    hook: bool,
) -> MergeOutcome:
    """lakeFS merge of ``source`` into the branch whose head is ``head``: one atomic update.

    Never a fast-forward: the new commit ``into`` has parents (head, source). Rejected when
    the pre-merge hook is installed and the head is not ``expected_head`` (412), or when the
    marker changed on both sides since the merge base, to different values (409).
    """
    if hook and head != expected_head:
        return MergeOutcome(commits, NO_REF, "412 expected-head hook: the head moved")
    base = commits[merge_base(commits, head, source)]
    dst, src = commits[head], commits[source]
    assert base is not None and dst is not None and src is not None
    if dst.marker != base.marker and src.marker != base.marker and dst.marker != src.marker:
        return MergeOutcome(commits, NO_REF, "409 conflict on the publication marker")
    marker = src.marker if dst.marker == base.marker else dst.marker
    merged = add_commit(
        commits,
        into,
        (head, source),
        kind="merge",
        owner=owner,
        input_ref=input_ref,
        marker=marker,
    )
    return MergeOutcome(merged, into, "")
