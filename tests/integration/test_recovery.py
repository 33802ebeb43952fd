"""Recovery after a crash, on the real servers: a worker SIGKILLed in the middle of a task is
restarted at once; the restarted worker fails the lost attempt itself, so Conductor retries it
without waiting out the response timeout (120 s here)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import attempts, one_step, publications, start, wait_workflow, worker


def test_a_killed_worker_s_attempt_is_retried_as_soon_as_the_worker_restarts(
    make_env: Callable[..., dict[str, str]],
    conductor: Any,
    store: Any,
    repo: str,
    unique: str,
    tmp_path: Path,
) -> None:
    env = make_env(PERAGO_TEST_RESPONSE_TIMEOUT="120")
    name = one_step(
        conductor, f"recover_{unique}", f"pt_write_{unique}", {"files": {"a.txt": "1"}, "sleep": 4}
    )
    wid = start(conductor, name, repo)
    with worker(env, tmp_path / "first.log") as first:
        first.wait_for("pre_guardrails_passed")
        time.sleep(1)  # inside the body
        first.signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
    work = Path(env["PERAGO_WORK_DIR"])
    assert list((work / "attempts").glob("*.json")), "the killed attempt left its record"
    killed_at = time.monotonic()
    with worker(env, tmp_path / "second.log") as second:
        second.wait_for("lost_attempt_failed")
        wf = wait_workflow(conductor, wid, timeout=100)  # well inside the response timeout
        recovered_in = time.monotonic() - killed_at
        second.stop()
    assert wf["status"] == "COMPLETED", wf.get("reasonForIncompletion")
    lost, retry = attempts(wf, "step")
    assert lost["status"] == "FAILED" and "restarted" in lost["reasonForIncompletion"]
    assert "responseTimeout" not in lost["reasonForIncompletion"]
    assert retry["status"] == "COMPLETED"
    assert len(publications(store, repo)) == 1
    leftovers = [p.name for p in work.iterdir() if p.name != "attempts"]
    assert leftovers == [] and not list((work / "attempts").glob("*.json"))
    print(f"recovered in {recovered_in:.1f} s (response timeout 120 s)")
