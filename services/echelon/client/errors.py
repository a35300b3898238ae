"""The errors every client call raises: one family, one class per gRPC status code.

    from echelon.client import Client, errors

    async with Client("127.0.0.1:7200") as client:
        try:
            await client.get_topic("quotes")
        except errors.NotFound as e:
            print(e.code.name, e.message, e.details)   # NOT_FOUND topic 'quotes' does not exist {}

Every failure, whether the agent refused a call, a publish was rejected in its ack, a
subscription stream ended, or the agent could not be reached, is an `EchelonError`
subclass carrying the status `code`, the server's `message` and `details` (the trailing
metadata the server sent). No `grpc.aio.AioRpcError` escapes the client. The classes are
the ones the services raise (`echelon.contract.errors`), so a handler's `NotFound` is the
application's `NotFound`. `Timeout` is also a `TimeoutError`; `ClientClosed` (a
`FailedPrecondition`) means the client, publisher or subscription is draining or closed.
"""

from __future__ import annotations

from contextlib import contextmanager

import grpc

from echelon.contract.errors import (BY_CODE, Aborted, AlreadyExists, Cancelled, DataLoss, EchelonError,
                                    FailedPrecondition, Internal, InvalidArgument, NotFound, OutOfRange,
                                    PermissionDenied, ResourceExhausted, Timeout, Unauthenticated, Unavailable,
                                    Unimplemented, Unknown, from_rpc_error, from_status, status_of)

__all__ = ["EchelonError", "Cancelled", "Unknown", "InvalidArgument", "Timeout", "NotFound", "AlreadyExists",
           "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented",
           "Internal", "Unavailable", "DataLoss", "Unauthenticated", "ClientClosed", "BY_CODE", "from_status",
           "from_rpc_error"]


class ClientClosed(FailedPrecondition):
    """The client, publisher or subscription is draining or closed: nothing new is accepted."""


@contextmanager
def translating():
    """Inside it, a gRPC failure or a local validation error leaves as the family's exception."""
    try:
        yield
    except grpc.aio.AioRpcError as e:
        raise from_rpc_error(e) from e
    except EchelonError:
        raise
    except Exception as e:
        status = status_of(e)  # SchemaError, FilterSyntaxError: the caller's input
        if status is None:
            raise
        raise from_status(*status) from e
