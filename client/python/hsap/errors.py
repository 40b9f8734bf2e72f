"""Exceptions of the HSAP Python client.

Every error the client raises is an `HsapError`, with `.code` (a
`grpc.StatusCode`) and `.message`:

* errors from the daemon keep its code and message (`INVALID_ARGUMENT` names
  the field and values, `DEADLINE_EXCEEDED` names the missing ranks, ...);
* problems found at the Python entry point, before anything is sent, are
  `InvalidInputError` (code `INVALID_ARGUMENT`), which is also a `ValueError`;
  a wrong dtype is `InvalidDTypeError`, also a `TypeError`.
"""

import grpc


class HsapError(Exception):
    """An HSAP call failed. `code`: grpc.StatusCode; `message`: what and why."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidInputError(HsapError, ValueError):
    """An argument failed validation in the Python client (nothing was sent)."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)


class InvalidDTypeError(InvalidInputError, TypeError):
    """A tensor has a dtype the call does not take."""


def from_rpc_error(error):
    """The HsapError for a grpc.RpcError raised by a stub call."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    return HsapError(code, details or "")
