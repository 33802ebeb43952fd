"""One HTTP configuration for every connection to lakeFS and its object storage.

Three clients carry the traffic, each where the figures put it (docs/benchmarks.md):
lakefs-sdk's urllib3 pool for the metadata calls, libcurl's multi interface
(:mod:`perago.adapters.curl`) for many object transfers at once, and a urllib3 pool
streaming large downloads on threads (:mod:`perago.adapters.objects`). All three take the
server's address, the credentials, the timeouts and the certificates to trust from one
:class:`HttpConfig`, built once from the settings, so that a private CA or a timeout set
once holds for every request.
"""

from __future__ import annotations

import base64
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import urllib3

__all__ = ["HttpConfig", "trusted_certificates"]


def trusted_certificates() -> tuple[str | None, str | None]:
    """The CA file and directory Python's ``ssl`` trusts (``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` first): how a private CA is trusted, for every client alike."""
    paths = ssl.get_default_verify_paths()
    cafile = os.environ.get("SSL_CERT_FILE") or paths.cafile
    capath = os.environ.get("SSL_CERT_DIR") or paths.capath
    return cafile or None, capath or None


@dataclass(frozen=True)
class HttpConfig:
    """Where lakeFS answers, with which credentials, how long to wait, whom to trust."""

    #: lakeFS's API root (``.../api/v1``).
    base: str = ""
    #: Sent with every request to lakeFS (never to a pre-signed URL): the Authorization.
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    connect_timeout: float = 10.0
    #: A call or transfer fails after this long without a byte.
    read_timeout: float = 60.0
    ca_file: str | None = field(default_factory=lambda: trusted_certificates()[0])
    ca_dir: str | None = field(default_factory=lambda: trusted_certificates()[1])

    @classmethod
    def for_lakefs(
        cls, base: str, access_key_id: str, secret: str, *, read_timeout: float
    ) -> HttpConfig:
        token = base64.b64encode(f"{access_key_id}:{secret}".encode()).decode()
        return cls(base, {"Authorization": f"Basic {token}"}, read_timeout=read_timeout)

    @property
    def header_lines(self) -> tuple[str, ...]:
        """:attr:`headers` as libcurl takes them (``Name: value``)."""
        return tuple(f"{k}: {v}" for k, v in self.headers.items())

    def stream_pool(self, *, maxsize: int) -> urllib3.PoolManager:
        """A urllib3 pool for streamed downloads (no retries of its own: the adapters' one
        policy retries)."""
        return urllib3.PoolManager(
            maxsize=maxsize,
            timeout=urllib3.Timeout(connect=self.connect_timeout, read=self.read_timeout),
            retries=False,
            ca_certs=self.ca_file,
            ca_cert_dir=self.ca_dir,
        )
