"""A real OTLP/HTTP receiver: what an OpenTelemetry Collector's `otlphttp` receiver does, for the tests.

It accepts `POST /v1/metrics` and `POST /v1/traces` (protobuf, plain or gzip), decodes each body with
the official `opentelemetry-proto` messages and keeps them; the test reads them back. The answer is the
protocol's empty Export*ServiceResponse, as the specification asks.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass
class Received:
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        with self.lock:
            return [
                (attributes(rs.resource.attributes), span)
                for request in self.traces
                for rs in request.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]

    def data_points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, data point) for every point of the metric `name` received."""
        found = []
        with self.lock:
            for request in self.metrics:
                for rm in request.resource_metrics:
                    for sm in rm.scope_metrics:
                        for metric in sm.metrics:
                            if metric.name != name:
                                continue
                            kind = metric.WhichOneof("data")
                            for point in getattr(metric, kind).data_points:
                                found.append((attributes(rm.resource.attributes), point))
        return found


def _handler(received: Received) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/metrics":
                request: Any = ExportMetricsServiceRequest.FromString(body)
                answer: Any = ExportMetricsServiceResponse()
                target = received.metrics
            elif self.path == "/v1/traces":
                request = ExportTraceServiceRequest.FromString(body)
                answer = ExportTraceServiceResponse()
                target = received.traces
            else:
                self.send_error(404)
                return
            with received.lock:
                target.append(request)
                received.headers.append(dict(self.headers.items()))
            payload = answer.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(received))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
