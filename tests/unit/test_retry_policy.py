"""The one retry policy's schedules, as the docs and the module's docstring state them
(perago/core/retry_policy.py); each deviation is exercised where it is used, too."""

from __future__ import annotations

import pytest

from perago.coord.errors import CoordStoreError
from perago.coord.s3 import retry_reads
from perago.core import retry_policy


def test_the_poll_backoff_doubles_from_one_second_to_thirty() -> None:
    waits = [retry_policy.poll_backoff(n) for n in range(1, 8)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_throttled_merge_waits_a_quarter_second_doubling() -> None:
    tries = range(1, retry_policy.MERGE_TRIES)
    assert [retry_policy.merge_throttle_wait(n) for n in tries] == [0.25, 0.5, 1.0]


def test_contention_waits_are_jittered_below_a_doubling_cap() -> None:
    for attempt, ceiling in [(0, 0.01), (1, 0.02), (3, 0.08), (12, 0.5)]:
        waits = {retry_policy.contention_wait(attempt, first=0.01, cap=0.5) for _ in range(50)}
        assert all(0 <= w <= ceiling for w in waits), (attempt, max(waits))
        assert len(waits) > 1, "full jitter: the waits differ"


def test_coordination_reads_ride_out_transient_failures_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("tenacity.nap.time.sleep", slept.append)
    answers: list[BaseException | str] = [
        CoordStoreError("no answer"),
        CoordStoreError("busy", status=503),
        CoordStoreError("slow down", status=429),
        "value",
    ]

    def read() -> str:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert retry_reads(read) == "value"
    assert slept == [0.1, 0.2, 0.4]

    forbidden = [CoordStoreError("forbidden", status=403), "never read"]

    def refused() -> str:
        answer = forbidden.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    with pytest.raises(CoordStoreError, match="forbidden"):
        retry_reads(refused)
    assert forbidden == ["never read"], "a 4xx is not read again"

    always: list[int] = []

    def down() -> str:
        always.append(1)
        raise CoordStoreError("down", status=500)

    with pytest.raises(CoordStoreError, match="down"):
        retry_reads(down)
    assert len(always) == 4
