"""A small OTLP/HTTP trace and OpenLineage HTTP receiver for the telemetry tests: the
standard library's HTTP server, spans decoded with the OTLP protobuf messages, lineage
events kept as the JSON they arrived as. ``delay`` holds every answer that long (a slow
receiver); :meth:`held` tells whether a request is still waiting for its answer."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, Any]
    #: OTLP status code: 0 unset, 1 ok, 2 error
    status: int = 0


@dataclass
class Receiver:
    delay: float = 0.0
    spans: list[Span] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: (path, arrived, answered or None) of every request
    requests: list[list[Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                record = [self.path, time.time(), None]
                with receiver.lock:
                    receiver.requests.append(record)
                if receiver.delay:
                    time.sleep(receiver.delay)
                if self.path.startswith("/v1/traces"):
                    receiver._spans(body)
                    reply, kind = b"", "application/x-protobuf"
                else:
                    with receiver.lock:
                        receiver.events.append(json.loads(body))
                    reply, kind = b"{}", "application/json"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                record[2] = time.time()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _spans(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for s in scope.spans:
                    attributes = {}
                    for kv in s.attributes:
                        value = kv.value
                        attributes[kv.key] = getattr(
                            value, value.WhichOneof("value") or "string_value"
                        )
                    found.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            attributes=attributes,
                            status=s.status.code,
                        )
                    )
        with self.lock:
            self.spans.extend(found)

    def held(self) -> bool:
        """Some request arrived and is still waiting for its answer."""
        with self.lock:
            return any(answered is None for _, _, answered in self.requests)

    def answered(self) -> int:
        with self.lock:
            return sum(answered is not None for _, _, answered in self.requests)
