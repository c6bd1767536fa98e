"""Process-group layouts the collective microbenchmarks run on (plain data, no torch).

Ranks are numbered node by node (``rank = node * ranks_per_node + local``), as torchrun and
``sim.net.placement`` number them.  Every group of a layout runs its collective at the same time,
as the groups of one parallelism dimension do in training:

* ``world``: all ranks (data parallelism over the whole job);
* ``tp<g>``: adjacent blocks of ``g`` ranks inside a node, for every ``g = 2, 4, ...`` below
  the node's size (TP groups; ``sim.net.placement`` puts TP innermost); ``node`` is the block of a
  whole node when the job spans several (with NVSwitch, what NCCL's NVLS algorithms run on);
* ``dp<g>``: ``g`` ranks strided across the node (``stride = ranks_per_node / g``), DP-like
  groups that cross TP groups;
* ``cross``: one rank per node, for every local rank at once (DP across nodes: every GPU's
  traffic on the scale-out network together);
* point-to-point pairs ``pp`` (neighbours in a node) and ``pp_cross`` (the same local rank on
  consecutive nodes), pipeline-like.

``tier`` says which link a group crosses: ``intra`` (inside one node) or ``inter`` (between
nodes); ``validate.fit_links`` fits each tier from its own records.
"""

from __future__ import annotations

Groups = list[list[int]]


def _powers_of_two_below(n: int) -> list[int]:
    out, g = [], 2
    while g < n:
        if n % g == 0:
            out.append(g)
        g *= 2
    return out


def group_layouts(world: int, ranks_per_node: int) -> list[tuple[str, Groups]]:
    """Collective layouts of a job with ``world`` ranks, ``ranks_per_node`` per node."""
    lw = max(1, min(ranks_per_node, world))
    nodes = max(1, world // lw)
    out: list[tuple[str, Groups]] = []
    if world >= 2:
        out.append(("world", [list(range(world))]))
    for g in _powers_of_two_below(lw):
        out.append((f"tp{g}", [list(range(b, b + g)) for b in range(0, world, g)]))
    if nodes > 1 and lw >= 2:
        out.append(("node", [list(range(n * lw, (n + 1) * lw)) for n in range(nodes)]))
    for g in _powers_of_two_below(lw):
        stride = lw // g
        if stride < 2:
            continue
        groups = [[n * lw + i + j * stride for j in range(g)] for n in range(nodes) for i in range(stride)]
        out.append((f"dp{g}", groups))
    if nodes > 1 and lw >= 2:
        out.append(("cross", [[n * lw + r for n in range(nodes)] for r in range(lw)]))
    return out


def pp_pairs(world: int, ranks_per_node: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """Point-to-point layouts: neighbour pairs inside a node, and across nodes."""
    lw = max(1, min(ranks_per_node, world))
    nodes = max(1, world // lw)
    out: list[tuple[str, list[tuple[int, int]]]] = []
    if lw >= 2:
        out.append(("pp", [(n * lw + i, n * lw + i + 1) for n in range(nodes) for i in range(0, lw - 1, 2)]))
    if nodes > 1:
        out.append(("pp_cross", [(n * lw + r, (n + 1) * lw + r) for n in range(0, nodes - 1, 2) for r in range(lw)]))
    return out


def tier(ranks: list[int] | tuple[int, ...], ranks_per_node: int) -> str:
    """``intra`` when every rank is on one node, else ``inter``."""
    return "intra" if len({r // max(1, ranks_per_node) for r in ranks}) == 1 else "inter"
