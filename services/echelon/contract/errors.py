"""The error family shared by the services and the client: one class per gRPC status code.

Handlers raise them and the server interceptor turns them into statuses (`status_of`);
the client turns every status it receives back into the same class (`from_status`,
`from_rpc_error`), so what a handler raised as `NotFound` reaches the application as
`echelon.client.errors.NotFound`. This module needs nothing but grpcio and the pure core,
so the client can use it without the server's dependencies.
"""

from __future__ import annotations

from typing import Mapping

import grpc

from echelon.contract.filters import FilterSyntaxError, FilterTooLarge
from echelon.contract.schema import SchemaError

Details = Mapping[str, "str | bytes"]


class EchelonError(Exception):
    """A failed call: `code` (a grpc.StatusCode), the server's `message`, and `details`,
    the trailing metadata the server sent with the status (e.g. a membership replica's
    recorded incarnation, or `grpc-status-details-bin` for a rich error model)."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, details: Details | None = None):
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class Cancelled(EchelonError):
    code = grpc.StatusCode.CANCELLED


class Unknown(EchelonError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(EchelonError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class Timeout(EchelonError, TimeoutError):
    """DEADLINE_EXCEEDED, or a client-side wait that ran out; also a TimeoutError (so
    `except asyncio.TimeoutError` keeps working)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(EchelonError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(EchelonError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(EchelonError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(EchelonError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(EchelonError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(EchelonError):
    code = grpc.StatusCode.ABORTED


class OutOfRange(EchelonError):
    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(EchelonError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(EchelonError):
    code = grpc.StatusCode.INTERNAL


class Unavailable(EchelonError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(EchelonError):
    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(EchelonError):
    code = grpc.StatusCode.UNAUTHENTICATED


BY_CODE: dict[grpc.StatusCode, type[EchelonError]] = {cls.code: cls for cls in (
    Cancelled, Unknown, InvalidArgument, Timeout, NotFound, AlreadyExists, PermissionDenied, ResourceExhausted,
    FailedPrecondition, Aborted, OutOfRange, Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)}
_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def from_status(code: grpc.StatusCode | int, message: str, details: Details | None = None) -> EchelonError:
    """The exception for a non-OK status (a StatusCode, or its number as in a PublishAck)."""
    if isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return BY_CODE.get(code, Unknown)(message, details)


def from_rpc_error(e: grpc.aio.AioRpcError) -> EchelonError:
    """A failed call as the family's exception, carrying the status message and trailing metadata."""
    return from_status(e.code(), e.details() or "", {k: v for k, v in e.trailing_metadata() or ()})


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str] | None:
    """The status a domain exception stands for; None for a bug (INTERNAL, logged)."""
    if isinstance(exc, EchelonError):
        return exc.code, exc.message
    if isinstance(exc, (SchemaError, FilterSyntaxError, FilterTooLarge)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return None
