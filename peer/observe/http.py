"""The peer's HTTP server (aiohttp): ``/metrics``, ``/status``, the dashboard and its live feed.

Routes:

* ``GET /metrics``: Prometheus text format (:meth:`Observer.metrics`).
* ``GET /status``: the JSON of ``peer status --json``: both come from the peer's client
  service's ``status()``, nothing else builds it.
* ``GET /``: the dashboard (``static/index.html`` with its script and style, served from the
  package: no build step, no CDN).
* ``GET /api/federation``: every live peer's view, once (``?history=1``: with the samples of
  the last minutes).
* ``GET /events``: the same as Server-Sent Events: the first event carries the history, then
  one every ``SAMPLE_S`` carries the newest samples.

On loopback the server speaks plain HTTP. On any other address it takes the same TLS as the
client API (:func:`peer.server.api_server_tls`): clients present a certificate issued by a
trusted participant. The node certificate is renewed while the peer runs, so each handshake
picks the current context (through the SNI callback, which runs for every client hello).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from peer.observe.observer import Observer
from peer.observe.samples import SAMPLE_S
from peer.protocol.replies import StatusReply

__all__ = ["HttpServer", "current_context"]

log = logging.getLogger(__name__)

StatusSource = Callable[[], Awaitable[StatusReply]]
STATIC = Path(str(resources.files("peer.observe") / "static"))
SHUTDOWN_S = 2.0


def current_context(contexts: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """An SSL context whose handshakes switch to ``contexts()`` (the current one) as the
    client hello arrives, so a renewed certificate counts from the next connection."""
    first = contexts()

    def pick(sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any) -> None:
        sock.context = contexts()

    first.sni_callback = pick
    return first


def _json(data: object) -> str:
    return json.dumps(data, default=str, allow_nan=False, separators=(",", ":"))


class HttpServer:
    """Serves one peer's ``/metrics``, ``/status`` and dashboard on ``host:port``."""

    def __init__(
        self,
        observer: Observer,
        status: StatusSource,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.observer = observer
        self.status = status
        self.host = host
        self._port = port
        self._ssl = ssl_context
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        app.router.add_get("/api/federation", self._federation)
        app.router.add_get("/events", self._events)
        app.router.add_static("/static", STATIC)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
        self._site: web.TCPSite | None = None

    @property
    def port(self) -> int:
        addresses = self._runner.addresses  # the bound port (port 0: chosen by the system)
        if self._site is None or not addresses:
            raise RuntimeError("the HTTP server is not started")
        return int(addresses[0][1])

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/"

    async def start(self) -> None:
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self._port, ssl_context=self._ssl)
        await self._site.start()
        log.info("dashboard and metrics on %s", self.url)

    async def close(self) -> None:
        self._stopping.set()  # live feeds end their responses
        await self._runner.cleanup()

    # -- routes ----------------------------------------------------------------------------------
    async def _index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = await self.observer.metrics()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def _status(self, _request: web.Request) -> web.Response:
        status = (await self.status()).to_wire()
        return web.Response(text=_json(status), content_type="application/json")

    async def _federation(self, request: web.Request) -> web.Response:
        history = request.query.get("history", "") in ("1", "true", "yes")
        view = await self.observer.federation(history)
        return web.Response(text=_json(view), content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        history = True
        try:
            while not self._stopping.is_set():
                view = await self.observer.federation(history)
                history = False
                await response.write(f"event: federation\ndata: {_json(view)}\n\n".encode())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), SAMPLE_S)
        except (ConnectionResetError, ConnectionError):
            pass  # the page went away
        return response
