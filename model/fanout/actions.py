"""Every enabled action of a fan-out state: the attempts' steps, Conductor, the foreign
writer, lease expiry, the janitor and crashes (as in ``model.actions``)."""

from __future__ import annotations

from model import lease
from model.actions import CLOCK, CONDUCTOR, ENVIRONMENT, FOREIGN_WRITER, JANITOR
from model.fanout import conductor, worker
from model.fanout.config import FanoutConfig
from model.fanout.state import DONE, LIVE_TASK, Attempt, State, attempt_name, ref_name
from model.fanout.tree import (
    FOREIGN,
    FOREIGN_DATA,
    NO_REF,
    add_commit,
    private_slot,
    reachable,
    staged_slot,
)

__all__ = [
    "CLOCK",
    "CONDUCTOR",
    "FOREIGN_WRITER",
    "JANITOR",
    "actor_name",
    "successors",
    "terminal",
]

Transition = worker.Transition


def actor_name(cfg: FanoutConfig, actor: int) -> str:
    return ENVIRONMENT[actor] if actor < 0 else attempt_name(cfg, actor)


def _live(s: State) -> list[int]:
    return [i for i, a in enumerate(s.attempts) if a is not None and a.pc not in DONE]


def terminal(s: State) -> bool:
    return not _live(s) and all(t.status not in LIVE_TASK for t in s.tasks)


def _environment(cfg: FanoutConfig, s: State) -> list[Transition]:
    out: list[Transition] = []
    for slot in range(cfg.slots):
        for empty in (False, True) if cfg.noop else (False,):
            start = Attempt("fence1", empty=empty) if s.pinned else Attempt("start", empty=empty)
            polled = conductor.poll(cfg, s, slot, start)
            if polled is not None:
                body = "empty diff" if empty else "non-empty diff"
                where = "from r0, " if s.pinned else ""
                label = f"a worker polls {attempt_name(cfg, slot)}: {where}body -> {body}"
                out.append((CONDUCTOR, label, polled, False))
        timed_out = conductor.timeout(cfg, s, slot)
        if timed_out is not None:
            label = f"{attempt_name(cfg, slot)} times out (TIMED_OUT)"
            out.append((CONDUCTOR, label, timed_out, False))
    in_window = any(a is not None and a.pc in worker.RESET_WINDOW for a in s.attempts)
    if s.foreign and not in_window:
        head = s.commits[s.head]
        assert head is not None
        commits = add_commit(
            s.commits,
            FOREIGN,
            (s.head,),
            kind="foreign",
            markers=head.markers,
            data=head.data | FOREIGN_DATA,
        )
        committed = s._replace(
            commits=commits, head=FOREIGN, heads=s.heads | 1 << FOREIGN, foreign=0
        )
        out.append((FOREIGN_WRITER, f"commits F on {ref_name(cfg, s.head)}", committed, False))
    for key, held in enumerate(s.leases):
        expired = lease.expire(held)
        if expired is not None:
            label = f"{attempt_name(cfg, held.holder)}'s lease runs out (paused or dead)"
            leases = (*s.leases[:key], expired, *s.leases[key + 1 :])
            out.append((CLOCK, label, s._replace(leases=leases), False))
        deleted = lease.delete(held)
        if deleted is not None:
            label = f"the janitor deletes {attempt_name(cfg, held.holder)}'s run-out lease"
            leases = (*s.leases[:key], deleted, *s.leases[key + 1 :])
            out.append((JANITOR, label, s._replace(leases=leases), False))
    return out


def _normalize(s: State) -> State:
    """Forget private commits no one can reach or use any more (a dead attempt's)."""
    keep = reachable(s.commits, 1 << s.head | s.tags)
    commits = s.commits
    for slot, a in enumerate(s.attempts):
        if a is None or a.pc not in DONE:
            continue
        for ref in (staged_slot(slot), private_slot(slot)):
            if commits[ref] is not None and not keep >> ref & 1:
                commits = (*commits[:ref], None, *commits[ref + 1 :])
    return s if commits is s.commits else s._replace(commits=commits)


def successors(cfg: FanoutConfig, s: State) -> list[Transition]:
    out: list[Transition] = []
    for slot in _live(s):
        out.extend(worker.steps(cfg, s, slot))
        if cfg.crashes:
            crashed = (*s.attempts[:slot], Attempt("done"), *s.attempts[slot + 1 :])
            leases = tuple(
                held._replace(
                    expired=held.expired or held.holder == slot,
                    turn=NO_REF if held.turn == slot else held.turn,
                )
                for held in s.leases
            )
            out.append(
                (slot, "the worker dies", s._replace(attempts=crashed, leases=leases), False)
            )
    out.extend(_environment(cfg, s))
    return [
        (actor, label, _normalize(nxt), moved)
        if actor >= 0 and (moved or nxt.attempts[actor].pc in DONE)  # type: ignore[union-attr]
        else (actor, label, nxt, moved)
        for actor, label, nxt, moved in out
    ]
