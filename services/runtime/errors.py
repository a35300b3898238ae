"""Domain errors. Handlers raise them; the server interceptor turns them into statuses."""

from __future__ import annotations

import grpc

from echelon.core.filters import FilterSyntaxError
from echelon.core.schema import SchemaError


class EchelonError(Exception):
    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(EchelonError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(EchelonError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(EchelonError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(EchelonError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(EchelonError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unimplemented(EchelonError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Unavailable(EchelonError):
    code = grpc.StatusCode.UNAVAILABLE


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status a domain exception stands for; None for a bug (INTERNAL, logged)."""
    if isinstance(exc, EchelonError):
        return exc.code, exc.message
    if isinstance(exc, (SchemaError, FilterSyntaxError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return None
