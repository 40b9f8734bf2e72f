"""HSAP's Python client: exact packed attention through hsapd, in place of
flash_attn_varlen_func.

    import hsap
    out = hsap.varlen_attn(q, k, v, cu_seqlens, max_seqlen, causal=True)
    loss(out).backward()                      # Attention.Backward on the daemon

    # Several ranks (threads or processes, one session each):
    layout = hsap.dispatch(cu_seqlens, world_size=4, heads=H, kv_heads=H,
                           head_dim=D, dtype=torch.float32)
    group = hsap.Group("attn", rank=r, size=4, client=hsap.connect())
    rows = layout.indices(r)
    out_local = hsap.varlen_attn(q[rows], k[rows], v[rows], cu_seqlens,
                                 max_seqlen, group=group)

Public names: connect, Client, default_client, varlen_attn, Group, dispatch,
Dispatch, HsapError, InvalidInputError, InvalidDTypeError; modules
hsap.reference (a PyTorch reference) and hsap.daemon (a local hsapd for
tests). The generated protobuf modules are hsap.v1.*_pb2 (built by Bazel:
//client/python:hsap_v1_py).
"""

import pkgutil

# The generated hsap/v1 modules may live in another tree (bazel-bin) than
# these sources: let the package span every `hsap` folder on sys.path.
__path__ = pkgutil.extend_path(__path__, __name__)

from hsap.errors import HsapError, InvalidDTypeError, InvalidInputError  # noqa: E402
from hsap.client import Client, connect, default_client  # noqa: E402
from hsap.groups import Group  # noqa: E402
from hsap.attention import varlen_attn  # noqa: E402
from hsap.plans import Dispatch, dispatch  # noqa: E402

__all__ = ["Client", "Dispatch", "Group", "HsapError", "InvalidDTypeError", "InvalidInputError",
           "connect", "default_client", "dispatch", "varlen_attn"]
