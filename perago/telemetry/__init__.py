"""What an attempt tells the people watching it: the steps it passes (``steps``, which the
observers subscribe to), Prometheus metrics, OpenTelemetry traces, and the bounded text of
a failure (``failure_text``). The OpenLineage events need the running attempt, so they live
beside the worker (``perago.worker.lineage_events``).

Each module is imported on its own; nothing is imported here.
"""
