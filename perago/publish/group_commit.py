"""Group commit: the publications of one worker process onto one branch share a lease grant.

The branch lease serialises a branch's publications. Taking it costs round trips to the
coordination store, and a waiter polls for it, so a fan-out of disjoint writers published
at the lease's pace, not lakeFS's. This module groups them the way a database's group
commit does (MySQL's binlog stages, RocksDB's write groups). The first publication to take
the lease opens a group. Publications of the same process that arrive while it is held
join the group instead of waiting, when:

- their scope is disjoint from every current member's, and they belong to another step. An
  attempt never shares a grant with another attempt of its own step: a retry waits for the
  group to end, as it waited for the lease before;
- the group is young and small enough (``MAX_SECONDS``, ``MAX_MEMBERS``), so that other
  processes get the lease too.

Each member keeps its own staged commit, fences, merge, report and output ref; only the
grant is shared. Members take turns (:meth:`GroupMember.turn`) from the publish fence to
the merge or reset: a hard reset in lakeFS has no compare-and-swap, so no sibling may merge
inside one. A member hands the merge commit lakeFS made, read back and sitting on the head
its own fence saw, to the next member's turn, which then fences on it without reading the
head again. The grant is
released when the last member leaves. A member that fails leaves alone. When the process
dies, the grant expires as a lone holder's would.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TypeVar

import structlog

from perago.coord.branch_leases import BranchLeases, HeldLease
from perago.core.store import Commit
from perago.errors import LeaseBusyError, LeaseEndedError
from perago.publish.deliveries import LocalDeliveries
from perago.publish.identity import AttemptIdentity
from perago.publish.scope import overlaps
from perago.telemetry import metrics

__all__ = [
    "FENCE_FRESH_SECONDS",
    "MAX_MEMBERS",
    "MAX_SECONDS",
    "REPORT_SEND_SECONDS",
    "REPORT_WINDOW_SECONDS",
    "GroupMember",
    "LeaseGroups",
]

log = structlog.get_logger("perago.publish")
T = TypeVar("T")

#: A group admits at most this many publications, and only this long after it took the lease:
#: then it closes, ends when its members have left (before their reports), and the lease is
#: up for any process.
MAX_MEMBERS = 64
MAX_SECONDS = 2.0
#: How often the process's waiter for a busy lease reads its record.
POLL_SECONDS = 0.1
#: A member waiting for its turn wakes this often, so that the drain's interrupt reaches it.
TURN_SLICE_SECONDS = 0.5
#: A re-delivery waiting out report windows looks this often whether it may stop sooner:
#: at this process's deliveries, and (less often: a read each) at other processes' records.
WINDOW_LOOK_SECONDS = 0.1
RECORD_LOOK_SECONDS = 0.5
#: A report window: how long after an attempt left the branch lease its COMPLETED may still
#: land on Conductor. It is sent in the first ``REPORT_SEND_SECONDS`` of it (the rest is for a
#: request in flight).
REPORT_WINDOW_SECONDS = 10.0
REPORT_SEND_SECONDS = 8.0
#: A window opens only this soon after the attempt fence that let its publication through was
#: sent (closed at once otherwise: the next window takes the lease and the fence again). So a
#: re-delivery, whose poll came after every earlier delivery's passing fence, waits this plus
#: a window, times the clock-skew rate, from its poll: before the branch lease, off the branch.
FENCE_FRESH_SECONDS = 5.0


class _Group:
    """One grant of a branch lease and the publications sharing it."""

    def __init__(self, lease: HeldLease, opened: float) -> None:
        self.lease = lease
        self.opened = opened
        self.members: dict[int, AttemptIdentity] = {}
        self.admitted = 0
        #: The member whose turn it is (None: nobody's), guarded by ``turns``.
        self.turn: int | None = None
        self.turns = threading.Condition()
        self.renewing = threading.Lock()
        #: The head the last member's merge made, read back (read and written in turns).
        self.head: Commit | None = None

    def conflicts(self, me: AttemptIdentity) -> AttemptIdentity | None:
        for other in self.members.values():
            if overlaps(other.scope, me.scope) or other.same_step(me):
                return other
        return None


class LeaseGroups:
    """Hands out shares of branch leases to one process's publications (thread-safe)."""

    def __init__(
        self,
        leases: BranchLeases,
        *,
        max_members: int = MAX_MEMBERS,
        max_seconds: float = MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        deliveries: LocalDeliveries | None = None,
    ) -> None:
        self._leases = leases
        #: This process's deliveries, when the worker tells (a re-delivery's wait ends sooner).
        self.deliveries = deliveries
        self._max_members = max_members
        self._max_seconds = max_seconds
        self._clock = clock
        self._changed = threading.Condition()
        self._groups: dict[tuple[str, str], _Group] = {}
        #: Branches one of this process's waiters is reading the lease record of.
        self._polling: set[tuple[str, str]] = set()
        self._next_id = 0

    @property
    def wait_seconds(self) -> float:
        """How long a publication waits for the lease, or for its turn in a group."""
        return self._leases.wait.total_seconds()

    def wait_out_report_windows(self, repository: str, me: AttemptIdentity) -> tuple[float, str]:
        """For a re-delivered attempt, before it takes the branch lease: wait until no earlier
        delivery of its task id can report COMPLETED any more (docs/protocol.md, report
        windows). Each such delivery's passing attempt fence was sent before this delivery's
        poll (Conductor counted that poll, and the fence compares poll counts), its window
        opened within ``FENCE_FRESH_SECONDS`` of that fence and lasts ``REPORT_WINDOW_SECONDS``,
        on its own clock: so from the poll, their sum times the clock-skew rate. Ends sooner
        once every earlier delivery is known to have ended, in this process or by its record
        in the repository's coordination store (``perago.publish.deliveries``). Holds nothing
        meanwhile; returns the seconds waited and what ended the wait ("deadline", "here",
        "recorded")."""
        started = time.monotonic()  # the deliveries' clock, not the grants' (tests move it)
        local = self.deliveries
        polled = local.started_at(me.task_id, me.poll_count) if local is not None else None
        skew = self._leases.manager(repository).skew
        deadline = (polled if polled is not None else started) + (
            FENCE_FRESH_SECONDS + REPORT_WINDOW_SECONDS
        ) * skew
        next_read = started
        while (left := deadline - time.monotonic()) > 0:
            if local is not None:
                if local.earlier_ended_here(me.task_id, me.poll_count):
                    return time.monotonic() - started, "here"
                if time.monotonic() >= next_read:
                    next_read = time.monotonic() + RECORD_LOOK_SECONDS
                    if local.earlier_recorded(repository, me.task_id, me.poll_count):
                        return time.monotonic() - started, "recorded"
            time.sleep(min(left, WINDOW_LOOK_SECONDS))  # slices: the drain's interrupt
        return time.monotonic() - started, "deadline"

    def acquire(self, repository: str, branch: str, owner: str, me: AttemptIdentity) -> GroupMember:
        """Join the process's open group of the branch, or take the lease and open one;
        waits up to the leases' ``wait`` (LeaseBusyError after that).

        Of the process's waiters for one branch, one at a time reads the lease record (every
        ``POLL_SECONDS``; the lease manager tries once, and judges staleness on its own clock
        across the tries); the others wait for a group they can join to open.
        """
        key = (repository, branch)
        deadline = self._clock() + self._leases.wait.total_seconds()
        polling = False
        try:
            while True:
                with self._changed:
                    group = self._groups.get(key)
                    if group is not None and self._admits(group, me):
                        return self._join(key, group, me, owner, joined=True)
                    if not polling and key not in self._polling:
                        self._polling.add(key)
                        polling = True
                    left = deadline - self._clock()
                    if not polling and left > 0:
                        self._changed.wait(min(1.0, left))  # until the poller or a group moves
                        continue
                try:  # one look at the record: this loop is the only one that waits
                    lease = self._leases.acquire(repository, branch, owner, wait=timedelta(0))
                except LeaseBusyError:
                    if self._clock() >= deadline:
                        raise
                    # on the lease's clock, which judges when a silent holder is stale
                    self._leases.pause(
                        repository, max(0.0, min(POLL_SECONDS, deadline - self._clock()))
                    )
                    continue
                with self._changed:
                    group = _Group(lease, self._clock())
                    self._groups[key] = group
                    return self._join(key, group, me, owner, joined=False)
        finally:
            with self._changed:
                if polling:
                    self._polling.discard(key)
                self._changed.notify_all()  # the next poller, and the waiters that may join

    def _admits(self, group: _Group, me: AttemptIdentity) -> bool:
        return (
            bool(group.members)
            and group.admitted < self._max_members
            and self._clock() - group.opened < self._max_seconds
            and group.lease.manager.time_left(group.lease.grant) > 0
            and group.conflicts(me) is None
        )

    def _join(
        self, key: tuple[str, str], group: _Group, me: AttemptIdentity, owner: str, *, joined: bool
    ) -> GroupMember:
        self._next_id += 1
        group.members[self._next_id] = me
        group.admitted += 1
        if joined:
            log.info(
                "branch_lease_joined",
                fencing_token=group.lease.token,
                members=len(group.members),
                admitted=group.admitted,
            )
        return GroupMember(self, key, group, self._next_id, me, owner, joined=joined)

    def _leave(
        self, member: GroupMember, *, wait: bool, on_error: Callable[[Exception], None]
    ) -> None:
        group = member.group
        with self._changed:
            group.members.pop(member.id, None)
            if group.members:
                log.info(
                    "branch_lease_left", fencing_token=group.lease.token, members=len(group.members)
                )
                return
            if self._groups.get(member.key) is group:
                del self._groups[member.key]
            closed = (
                group.admitted >= self._max_members
                or self._clock() - group.opened >= self._max_seconds
            )
        if wait:
            try:
                group.lease.release()
            except Exception as e:  # noqa: BLE001 - it expires by itself
                on_error(e)
        else:
            group.lease.release_soon(on_error)
        log.info(
            "branch_lease_group_ended", fencing_token=group.lease.token, published=group.admitted
        )
        if not closed:
            # A group closed by its limits lets its process's waiters find the lease free at
            # their next poll, like other processes' waiters; otherwise they go at once.
            with self._changed:
                self._changed.notify_all()


class GroupMember:
    """One publication's share of a branch lease grant: every publication holds its lease
    this way (a group of one, when no other publication of the process shares it)."""

    def __init__(
        self,
        groups: LeaseGroups,
        key: tuple[str, str],
        group: _Group,
        id: int,
        me: AttemptIdentity,
        owner: str,
        *,
        joined: bool,
    ) -> None:
        self._groups = groups
        self.key = key
        self.group = group
        self.id = id
        self.me = me
        self._owner = owner
        #: It joined a grant another publication took (else it took the lease itself).
        self.joined = joined
        self._left = False
        self._handed: Commit | None = None
        #: Seconds it waited for its last turn and held it (None until then).
        self.turn_waited: float | None = None
        self.turn_held: float | None = None
        self._turn_taken = 0.0
        #: When (``time.monotonic()``) the attempt fence that passed under this share was sent.
        self.fenced_at: float | None = None

    @property
    def token(self) -> int:
        return self.group.lease.token

    def fence(self, check: Callable[[], object]) -> None:
        """Run an attempt fence under this share; once it passed, keep when its read was
        sent: a report window opens only within ``FENCE_FRESH_SECONDS`` of that."""
        sent = time.monotonic()
        check()
        self.fenced_at = sent

    def refresh(self) -> None:
        """Renew the shared grant if less than half its ttl is left (one member at a time)."""
        with self.group.renewing:
            self.group.lease.refresh()

    def guarded(self, write: Callable[[float], T]) -> T:
        return self.group.lease.guarded(write)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """The members' sections from reading the head to the merge or reset, one at a time.

        A turn takes the head the previous member handed over, whatever it then does: after
        anything but a merge read back on its fence's head (a reset, a failure, a lost
        answer) the next turn reads the head.

        Waits up to the leases' ``wait`` (LeaseBusyError after it), in slices the drain's
        interrupt can reach; the turn is taken and given back inside one ``try``, so an
        interrupt anywhere leaves it to the next member."""
        group, wait = self.group, self._groups.wait_seconds
        asked = time.monotonic()
        try:
            with group.turns:
                deadline = asked + wait
                while group.turn is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise LeaseBusyError(
                            f"a publication sharing this worker's grant of the branch lease "
                            f"held its turn for over {wait:.0f} s (PERAGO_LEASE_WAIT); nothing "
                            "of this attempt was published, and Conductor retries it",
                            holder=f"group member {group.turn}",
                            token=group.lease.token,
                        )
                    group.turns.wait(min(left, TURN_SLICE_SECONDS))
                group.turn = self.id
                self._handed, group.head = group.head, None
                self._turn_taken = time.monotonic()
                self.turn_waited, self.turn_held = self._turn_taken - asked, None
            metrics.BRANCH_TURN_SECONDS.labels("wait").observe(self.turn_waited)
            yield
        finally:
            self.end_turn()

    @property
    def shared(self) -> bool:
        """Whether other publications share the grant now (a lone one hands nothing on)."""
        return len(self.group.members) > 1

    def take_head(self) -> Commit | None:
        """In a turn: the head the previous member's merge made, if it handed one over (else
        read the head from lakeFS)."""
        head, self._handed = self._handed, None
        return head

    def leave_head(self, head: Commit) -> None:
        """In a turn, after a merge: the merge commit as lakeFS answered it (read back, not
        built), whose first parent the caller checked is the head this member's fence saw.

        The next member's fence then decides on the head as it was right after that merge,
        as if it had read it then; a writer that moves the branch meanwhile is refused at
        the next merge by the expected-head hook (412) when lakeFS runs it, and caught by
        the next member's post-publish check when it does not."""
        self.group.head = head

    def end_turn(self) -> None:
        """End the turn early: the merge is done, what follows it only reads."""
        with self.group.turns:
            if self.group.turn != self.id:
                return
            self.group.turn = None
            self.group.turns.notify()
        self.turn_held = time.monotonic() - self._turn_taken
        metrics.BRANCH_TURN_SECONDS.labels("held").observe(self.turn_held)

    def open_report_window(self) -> float:
        """The deadline (``time.monotonic()``) by which this member's COMPLETED report must be
        sent, opened as it leaves the grant (docs/protocol.md, report windows):
        ``REPORT_SEND_SECONDS`` from now, once the grant is known to be still this process's
        (renewed if half of it is gone) and its attempt fence was sent at most
        ``FENCE_FRESH_SECONDS`` ago. Already past (closed) otherwise: a window follows
        under the lease and the fence taken again, or the attempt reports FAILED."""
        now = time.monotonic()
        age = None if self.fenced_at is None else now - self.fenced_at
        if age is None or age > FENCE_FRESH_SECONDS:
            log.info("report_window_fence_stale", fence_age=None if age is None else round(age, 1))
            return now
        try:
            self.refresh()
        except LeaseEndedError:
            return now
        return now + REPORT_SEND_SECONDS

    def again(self) -> GroupMember:
        """A new share of the branch's lease for the same publication, after it left: its
        report window closed before Conductor took its COMPLETED, and a second window opens
        only under a grant (docs/protocol.md). Waits as a publication does (LeaseBusyError)."""
        return self._groups.acquire(*self.key, self._owner, self.me)

    def release(self) -> None:
        """Leave the group; the last member to leave releases the grant before returning."""
        self._leave(wait=True, on_error=_raise)

    def release_soon(self, on_error: Callable[[Exception], None]) -> None:
        """Leave the group; the last member to leave releases the grant in the background."""
        self._leave(wait=False, on_error=on_error)

    def _leave(self, *, wait: bool, on_error: Callable[[Exception], None]) -> None:
        if self._left:
            return
        self._left = True
        self._groups._leave(self, wait=wait, on_error=on_error)


def _raise(e: Exception) -> None:
    raise e
