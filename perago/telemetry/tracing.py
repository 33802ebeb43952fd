"""OpenTelemetry traces of attempts: one span per attempt, a child span per phase.

On only when ``opentelemetry-sdk`` is installed (``perago-runtime[otel]``) and the standard
variables ask for traces (``OTEL_TRACES_EXPORTER`` other than ``none``, or an OTLP
endpoint); otherwise nothing here imports OpenTelemetry and every call returns at once. A
tracer provider the process already set (``opentelemetry-instrument``) is used as it is.

Phases follow the attempt: the runtime names each step it enters (:func:`phase`), the
publisher's step boundaries split the publication into stage, fences and merge, and the
worker adds the report. The spans carry the attempt's workflow id, task id, step, retry
count, scope and refs (``perago.*`` attributes).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import structlog

from perago.errors import ConfigError
from perago.telemetry import steps
from perago.telemetry.steps import Boundary

__all__ = [
    "AttemptTrace",
    "annotate",
    "begin",
    "configure",
    "current",
    "enabled",
    "exemplar",
    "phase",
    "shutdown",
    "tracing",
]

log = structlog.get_logger("perago.tracing")

#: The phase span a step boundary inside the publication opens (None: close the open one).
_AFTER: dict[Boundary, str | None] = {
    Boundary.AFTER_STAGE: "fences",
    Boundary.AFTER_PUBLISH_FENCE: "merge",
    Boundary.AFTER_PUBLISH: None,
}

_tracer: Any = None
_provider: Any = None
_lock = threading.Lock()
_current: ContextVar[AttemptTrace | None] = ContextVar("perago_trace", default=None)


def _wanted(env: dict[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def configure(env: dict[str, str] | None = None) -> bool:
    """Set up tracing from the ``OTEL_*`` variables, once per process; True if it is on.
    A variable that asks for traces without the extra installed is a ConfigError."""
    global _tracer, _provider
    env = dict(os.environ) if env is None else env
    if not _wanted(env):
        return False
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT ask for traces, but "
            "opentelemetry-sdk is not installed: install perago-runtime[otel], or unset them"
        )
    with _lock:
        if _tracer is not None:
            return True
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
            provider = _make_provider(env)
            trace.set_tracer_provider(provider)
            _provider = provider
        from perago.core import VERSION as __version__

        _tracer = provider.get_tracer("perago", __version__)
        steps.observe(_on_boundary)  # once: observe() ignores a second registration
    log.info("tracing_on", exporters=env.get("OTEL_TRACES_EXPORTER") or "otlp")
    return True


def _make_provider(env: dict[str, str]) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if "OTEL_SERVICE_NAME" not in env and "service.name" not in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    ):
        resource = Resource.create({"service.name": "perago-worker"})
    else:
        resource = Resource.create()  # from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
    provider = TracerProvider(resource=resource)
    names = [n.strip() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",")]
    for name in filter(None, names):
        if name == "otlp":
            protocol = (
                env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            )
            if protocol != "http/protobuf":
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: Perago exports traces over "
                    "OTLP/HTTP (http/protobuf); point OTEL_EXPORTER_OTLP_ENDPOINT at the "
                    "collector's HTTP port (4318) and unset the protocol"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        elif name != "none":
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER names {name!r}; Perago knows otlp, console and none"
            )
    return provider


def enabled() -> bool:
    return _tracer is not None


def shutdown(timeout: float = 5.0) -> None:
    """Flush and stop the provider Perago made, waiting at most ``timeout`` seconds (an
    unreachable collector must not hold the worker's exit)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is None:
        return
    done = threading.Thread(target=provider.shutdown, daemon=True, name="perago-otel-shutdown")
    done.start()
    done.join(timeout)


class AttemptTrace:
    """The spans of one attempt: its root span and the phase span open now."""

    def __init__(self, tracer: Any, name: str, attributes: dict[str, Any]) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.root = tracer.start_span(name, attributes=attributes)
        self._tracer = tracer
        self._phase: Any = None
        self._lock = threading.Lock()
        self.trace_id = format(self.root.get_span_context().trace_id, "032x")

    def phase(self, name: str | None) -> None:
        """End the open phase span; open ``name`` as the next one (None: none)."""
        with self._lock:
            if self._phase is not None:
                self._phase.end()
                self._phase = None
            if name is not None and self.root.is_recording():
                context = self._trace.set_span_in_context(self.root)
                self._phase = self._tracer.start_span(name, context=context)

    def annotate(self, **attributes: Any) -> None:
        values = {f"perago.{k}": v for k, v in attributes.items() if v is not None and v != ""}
        self.root.set_attributes(values)

    def end(self, status: str, reason: str = "") -> None:
        from opentelemetry.trace import Status, StatusCode

        self.phase(None)
        if not self.root.is_recording():
            return
        self.root.set_attribute("perago.status", status)
        if status != "COMPLETED":
            self.root.set_status(Status(StatusCode.ERROR, reason[:500] or status))
        self.root.end()


def begin(
    *, task_type: str, workflow_id: str, task_id: str, step: str, retry_count: int
) -> AttemptTrace | None:
    """The trace of an attempt that starts now (None when tracing is off)."""
    tracer = _tracer
    if tracer is None:
        return None
    return AttemptTrace(
        tracer,
        f"perago.attempt {task_type}",
        {
            "perago.task_type": task_type,
            "perago.workflow_id": workflow_id,
            "perago.task_id": task_id,
            "perago.step": step,
            "perago.retry_count": retry_count,
        },
    )


@contextmanager
def tracing(trace: AttemptTrace | None) -> Iterator[None]:
    """Make ``trace`` what :func:`phase`, :func:`annotate` and boundaries use here."""
    token = _current.set(trace)
    try:
        yield
    finally:
        _current.reset(token)


def current() -> AttemptTrace | None:
    return _current.get()


def phase(name: str) -> None:
    """The running attempt entered phase ``name`` (no-op without a trace)."""
    trace = _current.get()
    if trace is not None:
        trace.phase(name)


def annotate(**attributes: Any) -> None:
    trace = _current.get()
    if trace is not None:
        trace.annotate(**attributes)


def exemplar() -> dict[str, str] | None:
    """A Prometheus exemplar linking a sample to the running attempt's trace."""
    trace = _current.get()
    return None if trace is None else {"trace_id": trace.trace_id}


def _on_boundary(boundary: Boundary, _attempt: steps.Attempt) -> None:
    trace = _current.get()
    if trace is not None and boundary in _AFTER:
        trace.phase(_AFTER[boundary])
