"""Destinations per token of a deduplicating MoE dispatcher (sim/moe_routing.py): closed forms
against enumeration of the routings they describe."""

import itertools
import math

import numpy as np
import pytest

from sim.moe_routing import dedup_fraction, remote_destinations


def _enumerate_random(e: int, k: int, u: int) -> float:
    """Exact mean over every k-subset of experts (small E) of the remote units it hits."""
    per = e // u
    total = count = 0
    for experts in itertools.combinations(range(e), k):
        hit = {x // per for x in experts}
        total += len(hit) * (u - 1) / u  # the sender is any unit equally often
        count += 1
    return total / count


@pytest.mark.parametrize("e,k,u", [(8, 2, 4), (12, 3, 4), (16, 4, 8), (16, 4, 2)])
def test_random_routing_matches_enumeration(e, k, u):
    assert remote_destinations(e, k, u, "random") == pytest.approx(_enumerate_random(e, k, u), rel=1e-12)


def test_random_routing_monte_carlo_deepseek_shape():
    # DeepSeek-V3: 256 experts, top-8, over 64 ranks (4 experts each) and over 8 nodes
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((20000, 256)), axis=1)[:, :8]
    for units in (64, 8):
        hits = np.array([len(set(row // (256 // units))) for row in picks])
        assert remote_destinations(256, 8, units) == pytest.approx(hits.mean() * (units - 1) / units, rel=0.01)


def test_fake_balanced_gate_known_answers():
    # Automodel FakeBalancedGate: token t -> experts (t*k + j) mod E.  Qwen3-30B-A3B on EP 8:
    # 16 experts per rank, 8 consecutive ones aligned to 8 -> one rank per token, remote 7/8.
    assert remote_destinations(128, 8, 8, "contiguous") == pytest.approx(7 / 8)
    # DeepSeek-V3 on EP 64: 4 experts per rank -> exactly 2 ranks per token
    assert remote_destinations(256, 8, 64, "contiguous") == pytest.approx(2 * 63 / 64)


@pytest.mark.parametrize("routing", ["random", "contiguous"])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6), (128, 8), (256, 8), (384, 8)])
@pytest.mark.parametrize("u", [1, 2, 4, 8, 32])
def test_dedup_never_sends_more_than_per_copy(e, k, u, routing):
    if e % u:
        return
    f = dedup_fraction(e, k, u, routing)
    assert 0 < f <= 1 + 1e-12
    if k == 1 or u == 1:
        assert f == pytest.approx(1.0)
    d = remote_destinations(e, k, u, routing)
    assert d <= min(k, u - 1) + 1e-12 and math.isfinite(d)
