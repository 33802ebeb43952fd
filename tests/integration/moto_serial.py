"""moto's S3 server with one request at a time, so its conditional writes are atomic.

moto 5 checks ``If-Match``/``If-None-Match`` and then writes, with no lock, on a threaded
server: two racing conditional PUTs can both pass the check (seen in CI: the racing-increments
contract test lost an update). S3 itself makes the check and the write one step. Serialising
requests restores that, at no cost for the coordination tests' small loads.

Run as ``python -m tests.integration.moto_serial HOST PORT``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple


def serialised(app: Callable[..., Iterable[bytes]]) -> Callable[..., list[bytes]]:
    """The WSGI app behind one lock, its response read whole inside it."""
    lock = threading.Lock()

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with lock:
            return list(app(environ, start_response))

    return wrapped


def main(host: str, port: int) -> None:
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, serialised(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
