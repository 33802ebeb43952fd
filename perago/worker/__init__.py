"""Running attempts: the poll loop (``loop``), one attempt start to finish (``runtime``,
``attempt``), its updates to the orchestrator (``report``), recovery after a crash
(``recovery``) and the health endpoints (``health``)."""

from perago.worker.loop import Worker

__all__ = ["Worker"]
