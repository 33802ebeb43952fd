"""lakeFS for the fan-out model: commits that carry a tree, 3-way merges and reverts.

A tree is what decides conflicts and what the invariants read: the scope markers (one value
per marker path: absent, the fixed "intent" bytes, or one attempt's claim) and the data
files, one per attempt that published and one for the foreign writer (a bitmask). Data
files never conflict (distinct paths), the worst case for the protocol: only the markers
can make lakeFS reject a merge. Commit ids are slot numbers fixed by the configuration.
"""

from __future__ import annotations

from typing import NamedTuple

from model.store import first_parent_history, reachable

__all__ = [
    "ABSENT",
    "FOREIGN",
    "FOREIGN_DATA",
    "INTENT",
    "NO_REF",
    "ROOT",
    "Commit",
    "add_commit",
    "claim",
    "first_parent_history",
    "merge_base",
    "merge_into",
    "merge_slot",
    "private_slot",
    "reachable",
    "revert",
    "staged_slot",
    "three_way",
    "tree_of",
]

NO_REF = -1
ROOT, FOREIGN = 0, 1
ABSENT, INTENT = 0, 1
FOREIGN_DATA = 1 << 30  # the foreign writer's file in a tree's data bitmask


def claim(slot: int) -> int:
    """A marker value unique to one attempt (its identity)."""
    return 2 + slot


class Commit(NamedTuple):
    parents: tuple[int, ...]
    kind: str  # root, foreign, staged, private (scoped replacement's branch), merge
    owner: int  # attempt slot named in the metadata; NO_REF: not Perago's
    markers: tuple[int, ...]  # value per marker path
    data: int  # bitmask of data files: bit = attempt slot, FOREIGN_DATA
    replaces: int  # merge of a scoped replacement: bitmask of the commits it reverted
    ancestors: int  # bitmask, itself included
    first_parents: int  # bitmask of its first-parent chain, itself included
    input_ref: int = NO_REF  # ``perago.input_ref`` of a Perago commit: what a retry pins


def staged_slot(slot: int) -> int:
    return 2 + 3 * slot


def private_slot(slot: int) -> int:
    return 3 + 3 * slot


def merge_slot(slot: int) -> int:
    return 4 + 3 * slot


def add_commit(
    commits: tuple[Commit | None, ...],
    ref: int,
    parents: tuple[int, ...],
    *,
    kind: str,
    markers: tuple[int, ...],
    data: int,
    owner: int = NO_REF,
    replaces: int = 0,
    input_ref: int = NO_REF,
) -> tuple[Commit | None, ...]:
    anc = 1 << ref
    for p in parents:
        parent = commits[p]
        assert parent is not None
        anc |= parent.ancestors
    first = commits[parents[0]] if parents else None
    fp = (1 << ref) | (first.first_parents if first is not None else 0)
    commit = Commit(parents, kind, owner, markers, data, replaces, anc, fp, input_ref)
    return (*commits[:ref], commit, *commits[ref + 1 :])


def merge_base(commits: tuple[Commit | None, ...], a: int, b: int) -> int:
    """A best common ancestor (no other common ancestor descends from it)."""
    ca, cb = commits[a], commits[b]
    assert ca is not None and cb is not None
    common = ca.ancestors & cb.ancestors
    for ref in range(len(commits) - 1, -1, -1):
        if not common >> ref & 1:
            continue
        others = common & ~(1 << ref)
        if not any(
            others >> o & 1 and commits[o].ancestors >> ref & 1  # type: ignore[union-attr]
            for o in range(len(commits))
        ):
            return ref
    raise AssertionError("no common ancestor")


def _pick(base: int, dst: int, src: int) -> int | None:
    if dst == base:
        return src
    if src in (base, dst):
        return dst
    return None


def three_way(
    base: tuple[tuple[int, ...], int],
    dst: tuple[tuple[int, ...], int],
    src: tuple[tuple[int, ...], int],
) -> tuple[tuple[int, ...], int] | None:
    """lakeFS's 3-way merge of two trees over their base; None on a conflict (409)."""
    markers = []
    for b, d, s in zip(base[0], dst[0], src[0], strict=True):
        picked = _pick(b, d, s)
        if picked is None:
            return None
        markers.append(picked)
    # Per data file: distinct paths never conflict on a single bit (d != b and s != b
    # means d == s), so the bitwise rule is exact.
    return tuple(markers), _bits(base[1], dst[1], src[1])


def _bits(base: int, dst: int, src: int) -> int:
    changed_dst = base ^ dst
    return (dst & changed_dst) | (src & ~changed_dst)


def tree_of(commit: Commit) -> tuple[tuple[int, ...], int]:
    return commit.markers, commit.data


def merge_into(
    commits: tuple[Commit | None, ...],
    tree: tuple[tuple[int, ...], int],
    into: int,
    source: int,
) -> tuple[tuple[int, ...], int] | None:
    """Merge commit ``source`` into ``tree`` (the content at or built on commit ``into``):
    a 3-way merge over their best common ancestor; None on a conflict (409)."""
    base, src = commits[merge_base(commits, into, source)], commits[source]
    assert base is not None and src is not None
    return three_way(tree_of(base), tree, tree_of(src))


def revert(
    tree: tuple[tuple[int, ...], int], commit: Commit, parent: Commit
) -> tuple[tuple[int, ...], int] | None:
    """``revert`` of ``commit`` against its first parent, applied to ``tree``; None on a
    conflict (the tree changed that path since)."""
    markers = list(tree[0])
    for i, (after, before) in enumerate(zip(commit.markers, parent.markers, strict=True)):
        if after == before:
            continue
        if markers[i] == after:
            markers[i] = before
        elif markers[i] != before:
            return None
    # A single file is either as the commit left it or as before it: never a conflict.
    changed = commit.data ^ parent.data
    return tuple(markers), (tree[1] & ~changed) | (parent.data & changed)
