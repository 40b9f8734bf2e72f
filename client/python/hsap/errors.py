"""Exceptions of the HSAP Python client (defined in hsap.client, the bottom
layer, and re-exported here under their documented names).

Every error the client raises is an `HsapError`, with `.code` (a
`grpc.StatusCode`) and `.message`, and where the call went: `.socket_path`
(the daemon), `.group` and `.rank` (None where unknown); str(error) leads
with them ("hsapd at /tmp/x/hsapd.sock, group 'g' rank 3: DEADLINE_EXCEEDED: ..."):

* errors from the daemon keep its code and message (`INVALID_ARGUMENT` names
  the field and values, `DEADLINE_EXCEEDED` names the missing ranks, ...);
* a daemon that does not answer within the client's deadline (hsap.client:
  deadline_ms plus a margin for attention calls, timeout_s for the others)
  is DEADLINE_EXCEEDED "no answer from hsapd within ..."; a daemon that died
  is UNAVAILABLE;
* problems found at the Python entry point, before anything is sent, are
  `InvalidInputError` (code `INVALID_ARGUMENT`), which is also a `ValueError`;
  a wrong dtype is `InvalidDTypeError`, also a `TypeError`.
"""

from hsap.client import HsapError, InvalidDTypeError, InvalidInputError, from_rpc_error

__all__ = ["HsapError", "InvalidDTypeError", "InvalidInputError", "from_rpc_error"]
