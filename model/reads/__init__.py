"""Reads and isolation (issue 25, docs/model-check.md): the fan-out model with named inputs.

``python -m model.reads`` explores a fork whose step B (scope ``b/``) reads the folder
``a/`` that its sibling A publishes, B's reads snapshot or serializable, the inputs pinned
to r0 or not (each attempt starts from the head, and reads its inputs there). The protocol
is the fan-out model's (``model.fanout``: the read-set check sits in its worker, the folder
contents in ``model.fanout.reads``); this package only names the configurations worth
checking.
"""

from __future__ import annotations

from model.fanout import FanoutConfig

__all__ = ["READS", "SUITE", "reading"]

#: B reads A's scope: a sibling publishes into the folder B reads.
READS: tuple[tuple[str, str], ...] = (("B", "a/"),)


def reading(isolation: str, **bounds: object) -> FanoutConfig:
    """A and B forking from r0, B reading ``a/`` with ``isolation``, pinned and unpinned;
    no foreign writer, no-op bodies or hook unless ``bounds`` say so (they add states, and
    the fan-out suite covers them without reads)."""
    base: dict[str, object] = {
        "steps": "AB",
        "reads": READS,
        "isolation": isolation,
        "pinned": (True, False),
        "noop": False,
        "foreign": "off",
        "hooks": (False,),
    }
    return FanoutConfig(**{**base, **bounds})  # type: ignore[arg-type]


#: What ``python -m model.reads`` runs: (what it shows, configuration). Without the read-set
#: check the reads change nothing, so A and B are symmetric under snapshot isolation: B
#: retried explores what A retried does.
SUITE: tuple[tuple[str, FanoutConfig], ...] = (
    ("snapshot, A retried: its replacement changes a/ under B", reading("snapshot", retried="A")),
    ("serializable, A retried", reading("serializable", retried="A")),
    ("serializable, B retried: a refused reader retries", reading("serializable", retried="B")),
    *(
        (
            f"{isolation}, no retries, no-op bodies, foreign writer, hook off and on",
            reading(isolation, retries=0, noop=True, foreign="outside-reset", hooks=(False, True)),
        )
        for isolation in ("snapshot", "serializable")
    ),
    (
        "serializable, no retries, crashes after any step (states, no violation)",
        reading("serializable", retries=0, crashes=True),
    ),
)
