"""How an exception reads in a failure reason and a log line: what a person needs, bounded.

A Py4J error's text is the whole Java stack (one ALS StackOverflowError wrote about 11,000
lines to the log, and its last line, ``at java.base/java.lang.Thread.run(...)``, became
Conductor's failure reason). A person needs the Java exception's class and message, and the
root cause; this module extracts those, and caps whatever it cannot parse.
"""

from __future__ import annotations

import sysconfig
import traceback
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_LINES", "UserTraceback", "bounded_traceback", "describe", "user_traceback"]

#: At most this many lines of any stack trace go to the log.
MAX_LINES = 40
_MAX_CHARS = 1500


def _java_lines(text: str) -> list[str]:
    """``Class: message`` lines of a Java stack dump: the exception, then its causes."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Caused by: "):
            out.append(line.removeprefix("Caused by: "))
        elif line.startswith(": ") and not out:  # py4j: "An error occurred while calling x.\\n: "
            out.append(line[2:])
    return out


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - py4j's __str__ needs the (possibly dead) JVM
        return ""


def describe(e: BaseException) -> str:
    """One readable line (or a few) for ``e``: for a Java error raised through PySpark, its
    class and message and the root cause, never a stack frame."""
    name = type(e).__name__
    text = _safe_str(e)
    java = _java_lines(text)
    if java:
        head, root = java[0], java[-1]
        what = head if root == head else f"{head} (root cause: {root})"
        return f"{name}: {what}"[:_MAX_CHARS]
    java_exception = getattr(e, "java_exception", None)
    if java_exception is not None:
        try:
            return f"{name}: {java_exception.toString()}"[:_MAX_CHARS]
        except Exception:  # noqa: BLE001 - the JVM that raised it is gone
            return f"{name}: a Java exception whose JVM is gone (the Spark driver died)"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return name
    first = lines[0] if len(lines) == 1 else f"{lines[0]} [+{len(lines) - 1} more lines]"
    return f"{name}: {first}"[:_MAX_CHARS]


def bounded_traceback(e: BaseException) -> str:
    """The Python traceback of ``e`` with every part capped at :data:`MAX_LINES` lines."""
    lines = "".join(traceback.format_exception(type(e), e, e.__traceback__)).splitlines()
    return "\n".join(_capped(lines))


def _capped(lines: list[str]) -> list[str]:
    """At most :data:`MAX_LINES` lines: the first and last halves, the middle counted."""
    if len(lines) <= MAX_LINES:
        return lines
    keep = MAX_LINES // 2
    return [*lines[:keep], f"... {len(lines) - 2 * keep} lines left out ...", *lines[-keep:]]


def _package_dir(name: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


#: Code whose frames a person debugging a task body does not need: folded, counted.
_FOLDED = {
    name: folder
    for name, folder in (
        ("perago", _package_dir("perago")),
        ("pyspark", _package_dir("pyspark")),
        ("py4j", _package_dir("py4j")),
        ("python", str(Path(sysconfig.get_paths()["stdlib"]).resolve())),
    )
    if folder
}


def _folded_by(filename: str) -> str | None:
    try:
        path = str(Path(filename).resolve())
    except OSError:
        return None
    for name, folder in _FOLDED.items():
        if path.startswith(folder + "/"):
            if name == "python" and "site-packages" in path:
                continue
            return name
    return None


@dataclass(frozen=True)
class UserTraceback:
    """A failure's traceback as a task author needs it: their frames, the rest folded."""

    text: str
    #: ``file:line`` of the innermost frame of the author's code ("" if none).
    location: str


def user_traceback(e: BaseException) -> UserTraceback:
    """The traceback of ``e`` trimmed to the task author's frames: runs of Perago, PySpark,
    py4j and standard-library frames are folded into one line each; the error itself is
    :func:`describe`'s text (for a Java error its class, message and root cause). Frames show
    code lines only, never variable values."""
    frames = traceback.extract_tb(e.__traceback__)
    lines = ["Traceback (most recent call last):"]
    folded: list[str] = []
    location = ""

    def flush() -> None:
        if folded:
            kinds = ", ".join(dict.fromkeys(folded))
            lines.append(f"  [{len(folded)} frame(s) of {kinds} folded]")
            folded.clear()

    for frame in frames:
        owner = _folded_by(frame.filename)
        if owner is not None:
            folded.append(owner)
            continue
        flush()
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
        location = f"{frame.filename}:{frame.lineno}"
    flush()
    lines.append(describe(e))
    return UserTraceback("\n".join(_capped(lines)), location)
