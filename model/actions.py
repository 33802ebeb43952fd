"""Every enabled action of a state: the attempts' steps and everything around them.

The environment: Conductor (polls, re-deliveries, response timeouts), the foreign writer,
lease expiry (the holder is paused or dead), the janitor deleting a run-out lease record, and
crashes (a worker dies after any step and its lease stays held until it expires). Successor
states are normalized so that states differing only in dead data compare equal.
"""

from __future__ import annotations

from model import conductor, lease, worker
from model.config import Config
from model.state import DONE, LIVE_TASK, Attempt, State, attempt_name, ref_name, task_of
from model.store import FOREIGN, add_commit, reachable, staged_slot

__all__ = [
    "CLOCK",
    "CONDUCTOR",
    "ENVIRONMENT",
    "FOREIGN_WRITER",
    "JANITOR",
    "actor_name",
    "successors",
    "terminal",
]

#: Actors that are not attempts (an attempt is named by its slot, >= 0).
CONDUCTOR, FOREIGN_WRITER, CLOCK, JANITOR = -1, -2, -3, -4

Transition = worker.Transition


#: Names of the actors that are not attempts (the fan-out model has the same ones).
ENVIRONMENT = {
    CONDUCTOR: "Conductor",
    FOREIGN_WRITER: "foreign writer",
    CLOCK: "time",
    JANITOR: "janitor",
}


def actor_name(cfg: Config, actor: int) -> str:
    return ENVIRONMENT[actor] if actor < 0 else attempt_name(cfg, actor)


def _live(s: State) -> list[int]:
    return [i for i, a in enumerate(s.attempts) if a is not None and a.pc not in DONE]


def terminal(s: State) -> bool:
    """Every attempt reported or died and Conductor has nothing left to hand out, time out or
    write back."""
    return not _live(s) and all(t.status not in LIVE_TASK for t in s.tasks) and s.extending < 0


def _foreign_may_commit(cfg: Config, s: State) -> bool:
    if s.foreign == 0:
        return False
    if cfg.foreign == "anytime":
        return True
    return not any(a is not None and a.pc in worker.RESET_WINDOW for a in s.attempts)


def _conductor(cfg: Config, s: State) -> list[Transition]:
    out: list[Transition] = []
    for task, t in enumerate(s.tasks):
        polled = conductor.poll(cfg, s, task)
        if polled is not None:
            out.append((CONDUCTOR, f"a worker polls t{task} (poll {t.poll + 1})", polled, False))
        again = conductor.redeliver(cfg, s, task)
        if again is not None:
            label = f"t{task} is delivered again, to another worker (poll {t.poll + 1})"
            out.append((CONDUCTOR, label, again, False))
        timed_out = conductor.timeout(cfg, s, task)
        if timed_out is not None:
            label = f"t{task} times out (TIMED_OUT)"
            if task + 1 < cfg.tasks:
                label += f"; retry t{task + 1} scheduled"
            out.append((CONDUCTOR, label, timed_out, False))
    return out


def _environment(cfg: Config, s: State) -> list[Transition]:
    out = _conductor(cfg, s)
    if _foreign_may_commit(cfg, s):
        head = s.commits[s.head]
        assert head is not None
        commits = add_commit(s.commits, FOREIGN, (s.head,), kind="foreign", marker=head.marker)
        committed = s._replace(
            commits=commits, head=FOREIGN, heads=s.heads | 1 << FOREIGN, foreign=s.foreign - 1
        )
        label = f"commits F on {ref_name(cfg, s.head)}"
        out.append((FOREIGN_WRITER, label, committed, False))
    expired = lease.expire(s.lease)
    if expired is not None:
        holder = attempt_name(cfg, s.lease.holder)
        label = f"{holder}'s branch lease runs out (its holder is paused or dead)"
        out.append((CLOCK, label, s._replace(lease=expired), False))
    deleted = lease.delete(s.lease)
    if deleted is not None:
        holder = attempt_name(cfg, s.lease.holder)
        label = f"the janitor deletes {holder}'s run-out lease record"
        out.append((JANITOR, label, s._replace(lease=deleted), False))
    for slot in range(cfg.slots):
        if s.windows >> slot & 1:  # report windows: the reporter paused past its end
            label = f"{attempt_name(cfg, slot)}'s report window ends (its reporter is paused)"
            out.append((CLOCK, label, s._replace(windows=s.windows & ~(1 << slot)), False))
        a = s.attempts[slot]
        if a is not None and a.fresh:  # FENCE_FRESH_SECONDS pass (the attempt is paused)
            label = f"{attempt_name(cfg, slot)}'s attempt fence goes stale (it is paused)"
            attempts = (*s.attempts[:slot], a._replace(fresh=False), *s.attempts[slot + 1 :])
            out.append((CLOCK, label, s._replace(attempts=attempts), False))
    return out


def _normalize(cfg: Config, s: State) -> State:
    """Forget staged commits no one can reach or use any more (a dead attempt's leftovers)."""
    keep = reachable(s.commits, 1 << s.head | s.tags)
    commits = s.commits
    for slot, a in enumerate(s.attempts):
        ref = staged_slot(slot)
        if commits[ref] is not None and a is not None and a.pc in DONE and not keep >> ref & 1:
            commits = (*commits[:ref], None, *commits[ref + 1 :])
    return s if commits is s.commits else s._replace(commits=commits)


def _extensions(cfg: Config, s: State) -> list[Transition]:
    """Response-timeout extensions: the attempt's thread sends one until its report starts;
    the server reads the task, and writes it back later (its update is not atomic)."""
    out: list[Transition] = []
    for slot in _live(s):
        a = s.attempts[slot]
        assert a is not None
        if a.pc in worker.REPORTING or a.status == worker.REPORTED or a.again:
            continue  # the extension thread stopped before the report (a second window's too)
        read = conductor.extension_reads(cfg, s, slot)
        if read is not None:
            label = "its response-timeout extension is sent: Conductor reads the task"
            out.append((slot, label, read, False))
    landed = conductor.extension_lands(cfg, s)
    if landed is not None:
        who = attempt_name(cfg, s.extending)
        task = s.tasks[task_of(cfg, s.extending)[0]]
        undone = " over its COMPLETED: IN_PROGRESS again" if task.status == "COMPLETED" else ""
        label = f"{who}'s extension writes the task back{undone}"
        out.append((CONDUCTOR, label, landed, False))
    return out


def successors(cfg: Config, s: State) -> list[Transition]:
    out: list[Transition] = []
    out.extend(_extensions(cfg, s))
    for slot in _live(s):
        out.extend(worker.steps(cfg, s, slot))
        crashed = (*s.attempts[:slot], Attempt("done"), *s.attempts[slot + 1 :])
        # A dead holder's grant will run out, and nothing it does tells "later" from "now":
        # every behaviour with a later expiry is one where the takers simply wait.
        held = s.lease._replace(expired=True) if s.lease.holder == slot else s.lease
        out.append((slot, "the worker dies", s._replace(attempts=crashed, lease=held), False))
    out.extend(_environment(cfg, s))
    # Only a step that ends an attempt or moves the branch can leave a staged commit dead.
    return [
        (actor, label, _normalize(cfg, nxt), moved)
        if actor >= 0 and (moved or nxt.attempts[actor].pc in DONE)  # type: ignore[union-attr]
        else (actor, label, nxt, moved)
        for actor, label, nxt, moved in out
    ]
