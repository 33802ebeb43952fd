"""Toxiproxy between the workers and each server: latency, bandwidth, resets, timeouts.

The server is built from the Go module proxy (``perago-dev/perago_dev/recipes/toxiproxy``, cached in
``.stack/bin``, built on demand like Helm) and driven over its HTTP API.
"""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import httpx

from perago_dev.build import build_toxiproxy

__all__ = ["Toxiproxy", "toxic"]


def toxic(kind: str, rng: random.Random) -> tuple[dict[str, object], float]:
    """A toxic of ``kind`` on a random direction, and how long to keep it (seconds)."""
    stream = rng.choice(["upstream", "downstream"])
    attributes: dict[str, object]
    if kind == "latency":
        attributes, seconds = {"latency": rng.randint(100, 1500), "jitter": 100}, 20.0
    elif kind == "bandwidth":
        attributes, seconds = {"rate": rng.choice([16, 64, 256])}, 15.0  # KB/s
    elif kind == "reset_peer":
        attributes, seconds = {"timeout": rng.randint(0, 500)}, 3.0
    elif kind == "timeout":
        attributes, seconds = {"timeout": rng.randint(500, 5000)}, 4.0
    else:  # slow_close
        attributes, seconds = {"delay": rng.randint(500, 3000)}, 15.0
    body = {
        "name": f"chaos_{kind}_{stream}",
        "type": kind,
        "stream": stream,
        "toxicity": 1.0,
        "attributes": attributes,
    }
    return body, seconds


class Toxiproxy:
    """One toxiproxy-server process and its proxies (name -> listen port -> upstream)."""

    def __init__(self, api_port: int, log: Path) -> None:
        binary = build_toxiproxy(progress=True)
        self._out = log.open("ab")
        self._proc = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(api_port)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )
        self._api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
        deadline = time.monotonic() + 30
        while True:
            try:
                self._api.get("/version").raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise RuntimeError(f"toxiproxy did not start; see {log}") from None
                time.sleep(0.2)

    def add(self, name: str, listen: int, upstream: int) -> None:
        self._api.post(
            "/proxies",
            json={
                "name": name,
                "listen": f"127.0.0.1:{listen}",
                "upstream": f"127.0.0.1:{upstream}",
                "enabled": True,
            },
        ).raise_for_status()

    def add_toxic(self, proxy: str, body: dict[str, object]) -> None:
        self._api.post(f"/proxies/{proxy}/toxics", json=body).raise_for_status()

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._api.delete(f"/proxies/{proxy}/toxics/{name}")

    def clear(self) -> None:
        """Remove every toxic (the proxies stay)."""
        self._api.post("/reset")

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._out.close()
