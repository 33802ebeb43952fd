"""Prometheus metrics of a worker. Labels are bounded: task names and outcomes, never ids."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from perago.telemetry.steps import Attempt, Boundary, observe

__all__ = [
    "ATTEMPTS",
    "BRANCH_TURN_SECONDS",
    "BYTES",
    "CACHE",
    "CACHE_BYTES_SAVED",
    "CONDUCTOR_SECONDS",
    "EVENT_LOOP_BLOCKED",
    "FENCE_REJECTIONS",
    "FILES",
    "IN_FLIGHT",
    "JANITOR_REMOVALS",
    "LINEAGE_EVENTS",
    "PUBLISH_SECONDS",
    "REPORT_PROBLEMS",
    "REPORT_RESENDS",
    "STAGE_SECONDS",
    "STEP_BOUNDARIES",
    "TIMEOUT_EXTENSIONS",
]

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

ATTEMPTS = Counter(
    "perago_attempts_total", "Attempts finished, by task and reported status.", ["task", "status"]
)
POLICY_REFUSALS = Counter(
    "perago_policy_refusals_total",
    "Attempts refused by the access policy before anything was read (target, source, protected).",
    ["kind"],
)
FENCE_REJECTIONS = Counter(
    "perago_fence_rejections_total", "Attempts stopped by a fence.", ["kind"]
)
PUBLISH_SECONDS = Histogram(
    "perago_publish_seconds",
    "Confirm duration (fence to published head).",
    ["mode"],
    buckets=_BUCKETS,
)
#: The serial section of a branch: a publication's wait for its turn among the members of
#: its lease grant, and how long it held the turn (the publish fence to the merge's answer
#: and its read-back, or a reset and its checks). Held time summed over a run is how busy
#: the branch was; the rest is grants changing hands and members not yet staged.
BRANCH_TURN_SECONDS = Histogram(
    "perago_branch_turn_seconds",
    "A publication's wait for its turn on the target branch (part=wait) and its turn (held).",
    ["part"],
    buckets=(0.005, 0.01, 0.025, *_BUCKETS),
)
STAGE_SECONDS = Histogram(
    "perago_stage_seconds", "Try duration (staging branch to staged commit).", buckets=_BUCKETS
)
BYTES = Counter("perago_bytes_total", "Bytes moved between lakeFS and workspaces.", ["direction"])
TRANSFER_RETRIES = Counter(
    "perago_transfer_retries_total",
    "Object transfers tried again after a transient failure (a reset, a 5xx, a stall).",
)
FILES = Counter("perago_files_total", "Files moved between lakeFS and workspaces.", ["direction"])
TIMEOUT_EXTENSIONS = Counter(
    "perago_timeout_extensions_total",
    'Conductor response-timeout extensions sent for running attempts ("lease" means only '
    "the branch lease).",
    ["result"],
)
CACHE = Counter(
    "perago_cache_total",
    "Worker-local content cache: hits, misses, entries added and damaged entries dropped.",
    ["result"],
)
CACHE_BYTES_SAVED = Counter(
    "perago_cache_bytes_saved_total", "Bytes copied from the content cache instead of lakeFS."
)
CONDUCTOR_SECONDS = Histogram(
    "perago_conductor_request_seconds",
    "Conductor API calls by endpoint (poll, update_task, get_task, ...) and outcome "
    "(ok, not_found, error).",
    ["endpoint", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
EVENT_LOOP_BLOCKED = Counter(
    "perago_event_loop_blocked_total",
    "Times an async task body blocked the worker's event loop for a second or more.",
)
IN_FLIGHT = Gauge("perago_attempts_in_flight", "Attempts running in this worker.")
LINEAGE_EVENTS = Counter(
    "perago_lineage_events_total",
    "OpenLineage run events: sent, failed to send, dropped (the queue was full).",
    ["result"],
)
JANITOR_REMOVALS = Counter(
    "perago_janitor_removals_total",
    "Leftovers removed by the janitor: staging branches, expired branch leases, old records "
    "of superseded deliveries.",
    ["kind"],
)
REPORT_RESENDS = Counter(
    "perago_report_resends_total",
    "Final reports sent again because a read-back did not show them (an overlapping update).",
)
REPORT_PROBLEMS = Counter(
    "perago_report_problems_total",
    "Attempts whose final report did not land or was not sent, or whose runner crashed "
    "(reported FAILED), by reason.",
    ["reason"],
)
STEPS_REUSED = Counter(
    "perago_steps_reused_total",
    "Attempts of incremental tasks answered from their step's earlier publication, body not run.",
    ["task"],
)
BODY_RETRIES = Counter(
    "perago_body_retries_total",
    "Task bodies tried again inside their attempt after a failure (@task body_retries).",
    ["task"],
)
STEP_BOUNDARIES = Counter(
    "perago_step_boundaries_total",
    "Step boundaries attempts passed (perago.telemetry.steps.Boundary): how far attempts get.",
    ["boundary"],
)


def _count(boundary: Boundary, _attempt: Attempt) -> None:
    STEP_BOUNDARIES.labels(boundary=boundary.value).inc()


observe(_count)
