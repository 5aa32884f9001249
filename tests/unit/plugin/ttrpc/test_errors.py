from __future__ import annotations

import pytest

from nri_gpu.plugin.ttrpc import (
    Code,
    ConnectionClosed,
    MessageTooLarge,
    ProtocolError,
    StatusError,
    TtrpcError,
    Unimplemented,
)

GRPC_CODES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
]  # fmt: skip


def test_codes_have_the_grpc_numbers() -> None:
    assert [(c.name, c.value) for c in Code] == [(name, i) for i, name in enumerate(GRPC_CODES)]


@pytest.mark.parametrize("exc_type", [ProtocolError, MessageTooLarge, ConnectionClosed, StatusError, Unimplemented])
def test_every_error_is_a_ttrpc_error(exc_type: type[Exception]) -> None:
    assert issubclass(exc_type, TtrpcError)


def test_message_too_large_is_a_protocol_error_with_go_wording() -> None:
    exc = MessageTooLarge(7, 4194305, 4194304)
    assert isinstance(exc, ProtocolError)
    assert (exc.stream_id, exc.length, exc.limit) == (7, 4194305, 4194304)
    assert str(exc) == "message length 4194305 exceed maximum message size of 4194304"


def test_status_error_coerces_int_codes() -> None:
    exc = StatusError(5, "no such pod")
    assert exc.code is Code.NOT_FOUND
    assert exc.message == "no such pod"
    assert str(exc) == "NOT_FOUND: no such pod"


@pytest.mark.parametrize("code", [0, Code.OK, 17, -1], ids=["int-0", "OK", "17", "-1"])
def test_status_error_rejects_ok_and_unknown_numbers(code: int) -> None:
    with pytest.raises(ValueError):
        StatusError(code, "x")


def test_unimplemented_is_a_status_error_with_code_12() -> None:
    exc = Unimplemented("method Frobnicate")
    assert isinstance(exc, StatusError)
    assert exc.code is Code.UNIMPLEMENTED
    assert exc.message == "method Frobnicate"
