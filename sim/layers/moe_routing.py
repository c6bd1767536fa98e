"""Where a token's routed copies go: destinations per token of a deduplicating MoE dispatcher.

DeepEP's dispatch sends a token once per *destination rank* (intranode kernels) and once per
*destination node* over RDMA (internode kernels, which forward the copy to the node's ranks over
NVLink), not once per chosen expert: ``Buffer.get_dispatch_layout`` computes
``is_token_in_rank`` / ``num_tokens_per_rdma_rank`` and the receiver expands a token to its local
experts (deepseek-ai/DeepEP ``csrc/kernels/layout.cu``, ``deep_ep/buffer.py``; the README's
bandwidths are of these received, deduplicated bytes, ``test_intranode.py``
``recv_x.numel()``).  The bytes a rank sends on a tier therefore scale with the expected number
of distinct *remote* destinations per token, ``D``, instead of ``top_k``.

Two routings are modelled (``Plan.moe_routing``):

* ``random``: each token's ``k`` experts are a uniform draw without replacement from ``E``,
  placed ``E/u`` per destination unit (Megatron-Core and DeepEP place experts contiguously by
  EP rank); a unit is hit with ``p = 1 - C(E - E/u, k) / C(E, k)`` (hypergeometric), so
  ``D = (u - 1) p`` (every unit but the sender's own is remote).  This is what balanced
  learned routing does on average; group-limited routing (DeepSeek-V3's at most 4 nodes)
  would cap ``D`` further and is not modelled.
* ``contiguous``: NeMo Automodel's ``FakeBalancedGate`` (``components/moe/layers.py``,
  ``fake_balanced_gate: true`` in its benchmark configs) routes token ``t`` to experts
  ``(t k + j) mod E``, ``j < k``: consecutive experts, so the copies of one token fall on one
  or two ranks.  ``D`` averages, over the gate's period, the units those experts span, times
  ``(u - 1)/u`` (the sender's own unit is one of the ``u`` equally often).

Known error: the expectation is per token; DeepEP's kernels move whole tokens in chunks, and
imbalance beyond the mean is ``Plan.moe_imbalance``'s.
"""

from __future__ import annotations

import functools
import math

ROUTINGS = ("random", "contiguous")


@functools.cache
def remote_destinations(num_experts: int, top_k: int, units: int, routing: str = "random") -> float:
    """Expected distinct remote destination units per token (``D`` above) when ``num_experts``
    experts are spread evenly over ``units`` ranks or nodes; ``units <= 1``: 0."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing {routing!r} must be one of {ROUTINGS}")
    if units <= 1:
        return 0.0
    e, k = num_experts, min(top_k, num_experts)
    per_unit = max(1, e // units)
    if routing == "random":
        miss = math.comb(e - per_unit, k) / math.comb(e, k) if e - per_unit >= k else 0.0
        return (units - 1) * (1.0 - miss)
    period = e // math.gcd(k, e)  # FakeBalancedGate's pattern repeats every E / gcd(k, E) tokens
    spans = 0
    for t in range(period):
        first = (t * k) % e
        spans += len({((first + j) % e) // per_unit for j in range(k)})
    return spans / period * (units - 1) / units


def dedup_fraction(num_experts: int, top_k: int, units: int, routing: str = "random") -> float:
    """Bytes a deduplicating dispatcher sends to remote units over what per-copy all-to-all
    sends to them (``top_k (u - 1)/u`` copies per token): ``D / (top_k (u-1)/u)``, in (0, 1]."""
    if units <= 1:
        return 1.0
    copies = min(top_k, num_experts) * (units - 1) / units
    return remote_destinations(num_experts, top_k, units, routing) / copies
