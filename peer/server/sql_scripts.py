"""The ``create_sql`` request: a SQL script the peer compiles and creates (docs/protocol.md,
``create_sql``; docs/sql.md).

Theory of operation
-------------------
A client in any language sends the script's text; the peer turns it into the requests it
already takes, so the site and the federation see nothing new:

1. *Read.* The streams the script reads without declaring them are read from its text
   (:func:`peer.model.sql.read_streams`) in a compile thread; at most
   :data:`MAX_LOOKUPS` of them are looked up through the service (a stream that is not
   there is left to the compiler, which names it with its line and column).
2. *Compile.* :func:`peer.model.sql.compile_script` makes the script's schemas, streams and
   queries in a compile thread, under the content limits (size, tokens, nesting, statements,
   boxes, expressions) and within ``compile_timeout_s``. Parsing is CPU work: in a thread the
   event loop keeps serving everyone else (``hello`` included) meanwhile. The threads are this
   object's own (``workers`` of them), so a flood of slow scripts queues behind itself and
   never takes the threads other work of the peer runs on. A compile still running when its
   time is up is left to finish in its thread (a thread cannot be stopped), its result
   dropped; the request is refused at once.
3. *Create.* Only a script compiled whole is created, through the service, in script order
   (:func:`peer.model.sql.submit.submit_script`): a refused script changes nothing. A
   refusal while creating (a stream of the same name with another schema, say) stops there
   and is the reply, as ``peer query submit FILE.sql`` has always done.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from peer.errors import NotFound, SqlError
from peer.model.limits import DEFAULT_LIMITS, ContentLimits
from peer.model.schema import Schema, check_name, parse_schema
from peer.model.sql.submit import submit_script

if TYPE_CHECKING:
    from peer.model.sql import Script
from peer.protocol.api import CreateSql
from peer.protocol.replies import CreateSqlReply
from peer.server.service import PeerService

__all__ = ["MAX_LOOKUPS", "SqlScripts"]

MAX_LOOKUPS = 64  # streams one script may read without declaring them
T = TypeVar("T")


class SqlScripts:
    """Serves ``create_sql`` for one API server; :meth:`close` stops its threads."""

    def __init__(
        self,
        service: PeerService,
        *,
        limits: ContentLimits = DEFAULT_LIMITS,
        compile_timeout_s: float = 10.0,
        workers: int = 2,
    ) -> None:
        if compile_timeout_s <= 0:
            raise ValueError(f"compile_timeout_s must be positive, not {compile_timeout_s!r}")
        self._service = service
        self._limits = limits
        self._timeout_s = compile_timeout_s
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="sql-compile")

    async def create(self, request: CreateSql) -> CreateSqlReply:
        """Compile ``request``'s script and create it; SqlError (with line and column where
        there is one) if it is refused, before anything is created."""
        from peer.model.sql import compile_script, read_streams  # (sqlglot: on first use)

        deadline = asyncio.get_running_loop().time() + self._timeout_s
        read = await self._compiling(deadline, read_streams, request.sql, limits=self._limits)
        known = await self._known(read, request.namespace)
        script: Script = await self._compiling(
            deadline,
            compile_script,
            request.sql,
            name=request.name,
            streams=known,
            namespace=request.namespace,
            limits=self._limits,
        )
        done = await submit_script(self._service, script, start=request.start)
        return CreateSqlReply(
            list(done.streams), list(done.queries), done.started, list(done.warnings)
        )

    def close(self) -> None:
        """Stop taking work; a compile under way finishes in its thread, unawaited."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _compiling(
        self, deadline: float, fn: Callable[..., T], *args: object, **kwargs: object
    ) -> T:
        """``fn(*args, **kwargs)`` in a compile thread, done by ``deadline`` (loop time)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                return await loop.run_in_executor(
                    self._threads, functools.partial(fn, *args, **kwargs)
                )
        except TimeoutError:
            raise SqlError(
                f"the SQL script took longer than {self._timeout_s:g} s to compile; split "
                "it into several scripts",
                limit="compile_timeout_s",
            ) from None

    async def _known(self, names: list[str], namespace: str) -> Mapping[str, Schema]:
        """The schemas of the existing streams among ``names`` (looked up on the peer)."""
        if len(names) > MAX_LOOKUPS:
            raise SqlError(
                f"the SQL script reads {len(names)} streams it does not declare; at most "
                f"{MAX_LOOKUPS} are looked up (declare them with CREATE STREAM)",
                limit="max_sql_lookups",
            )
        known: dict[str, Schema] = {}
        for name in names:
            full = check_name(namespace + name, "stream", SqlError)
            try:
                found = await self._service.lookup(full)
            except NotFound:
                continue  # the compiler refuses the script naming where it reads the stream
            schema = found.extra.get("schema")
            if found.kind == "stream" and isinstance(schema, dict | str):
                known[name] = parse_schema(schema)
        return known
