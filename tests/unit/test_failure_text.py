"""Failure reasons a person can read: a Java error's class and message, never a stack frame."""

from __future__ import annotations

from perago.telemetry.failure_text import MAX_LINES, bounded_traceback, describe
from perago.worker.runtime import outcome_of

JAVA = (
    "An error occurred while calling o123.fit.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed\n"
    + "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(x.scala:1)\n" * 5000
    + "Caused by: java.lang.StackOverflowError: deep recursion\n"
    + "\tat java.base/java.lang.Thread.run(Thread.java:840)\n"
)


class Py4JJavaError(Exception):
    pass


class DeadJavaError(Exception):
    """Like a Py4J error whose JVM is gone: str() itself fails."""

    def __str__(self) -> str:
        raise ConnectionRefusedError("gateway gone")


def test_a_java_stack_becomes_its_exception_and_root_cause() -> None:
    text = describe(Py4JJavaError(JAVA))
    assert text == (
        "Py4JJavaError: org.apache.spark.SparkException: Job aborted due to stage failure: "
        "Task 0 failed (root cause: java.lang.StackOverflowError: deep recursion)"
    )
    reason = outcome_of(Py4JJavaError(JAVA), where="task body").reason
    assert reason.startswith("task body: Py4JJavaError: org.apache.spark.SparkException")
    assert "\tat " not in reason


def test_unprintable_and_long_errors_stay_short() -> None:
    assert describe(DeadJavaError()) == "DeadJavaError"
    long = describe(RuntimeError("first line\n" + "more\n" * 1000))
    assert long == "RuntimeError: first line [+1000 more lines]"
    assert describe(ValueError("plain")) == "ValueError: plain"


def test_tracebacks_in_logs_are_bounded() -> None:
    def recurse(n: int) -> None:
        if n == 0:
            raise Py4JJavaError(JAVA)
        recurse(n - 1)

    try:
        recurse(200)
    except Py4JJavaError as e:
        text = bounded_traceback(e)
    assert len(text.splitlines()) <= MAX_LINES + 1
    assert "lines left out" in text
