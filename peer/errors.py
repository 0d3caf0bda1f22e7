"""The peer's error families.

Every error a user can see names what it is about (stream, field, query, box, peer) and
carries a stable ``code`` that travels over the wire, so clients branch on codes, never on
message text. ``retriable`` says whether the same request may succeed later unchanged.
"""

from __future__ import annotations

from typing import Any


class FedstreamError(Exception):
    """Base of every error the peer raises on purpose."""

    code = "error"
    retriable = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = {k: v for k, v in details.items() if v is not None}

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidInput(FedstreamError):
    """The caller's input is wrong; nothing was changed."""

    code = "invalid"


class SchemaError(InvalidInput):
    code = "invalid_schema"


class QueryError(InvalidInput):
    """A query definition is wrong. Messages name the query, box and parameter."""

    code = "invalid_query"


class ExpressionError(QueryError):
    """An expression does not parse, uses something not allowed, or does not type-check."""

    code = "invalid_expression"


class SqlError(QueryError):
    """A SQL script is refused. Details carry the ``line`` and ``column`` (from 1) of what is
    wrong; the message says why and what to write instead."""

    code = "invalid_sql"


class TupleError(InvalidInput):
    """A pushed batch holds a bad tuple; the whole batch was refused."""

    code = "invalid_tuple"


class NotFound(FedstreamError):
    code = "not_found"


class AlreadyExists(FedstreamError):
    code = "already_exists"


class Conflict(FedstreamError):
    """The request is valid but not in the object's current state (e.g. delete a running query)."""

    code = "conflict"


class EngineError(FedstreamError):
    code = "engine"
    retriable = True


class JavaMissing(EngineError):
    code = "java_missing"
    retriable = False


class Unavailable(FedstreamError):
    code = "unavailable"
    retriable = True


class Unauthorized(FedstreamError):
    """Mutual TLS failed: the peer does not trust this client's participant, or the client
    does not trust the peer's."""

    code = "unauthorized"


ERRORS_BY_CODE: dict[str, type[FedstreamError]] = {
    cls.code: cls
    for cls in (
        FedstreamError,
        InvalidInput,
        SchemaError,
        QueryError,
        ExpressionError,
        SqlError,
        TupleError,
        NotFound,
        AlreadyExists,
        Conflict,
        EngineError,
        JavaMissing,
        Unavailable,
        Unauthorized,
    )
}


def from_wire(payload: dict[str, Any]) -> FedstreamError:
    """Rebuild an error sent by a peer (unknown codes become the base class)."""
    cls = ERRORS_BY_CODE.get(str(payload.get("code")), FedstreamError)
    details = payload.get("details") or {}
    if not isinstance(details, dict):
        details = {}
    return cls(str(payload.get("message", "error")), **details)
