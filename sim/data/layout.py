"""Pipeline layouts: which layers each model chunk of each pipeline rank holds.

A layout is Megatron-Core's ``--pipeline-model-parallel-layout`` (``PipelineParallelLayerLayout``
in megatron/core/transformer/pipeline_parallel_layer_layout.py, core_v0.13.0+): one string per
*virtual* stage, in Megatron's flat order (virtual stage ``c * pp + i`` is chunk ``c`` of
pipeline rank ``i``), each a sequence of ``E`` (embedding), ``t`` (transformer decoder layer),
``m`` (multi-token-prediction layer) and ``L`` (loss, with the final norm and output layer).
``len(layout) == pp * vp``; decoder layers are numbered in flat order, so rank ``i``'s chunk
``c`` holds the decoder layers that follow those of every earlier virtual stage.

The text form is Megatron's (``LayoutText``): stages split by ``|``, ``x*n`` repeats a layer,
``(...)*n`` repeats a group, commas are cosmetic; e.g. DeepSeek-V3's ``Et*3|(tt|)*29,m|L`` is
16 ranks x 2 chunks.  ``parse_layout`` reads it exactly as ``parse_str_to_list`` does,
``format_layout`` writes the shortest form this module produces (no commas, so it fits in a
STRATEGY string), and ``megatron_layout`` gives the layout Megatron-Core builds from the older
flags (``--decoder-first/last-pipeline-num-layers``, ``--account-for-embedding/loss-in-pipeline-
split``, even splits; ``get_num_layers_to_build`` in megatron/core/transformer/transformer_block.py).

``check_layout`` applies Megatron's ``validate_layer_layout`` rules (the embedding first, the
loss last, each once, the model's decoder layers exactly, MTP layers after every decoder layer
and only in a rank's last chunk).  The cost model prices every chunk (``sim.layers.stages``); MTP
layers are priced from the model's ``mtp_layers`` in the last stage's last chunk
(``sim.layers.stages.model_chunks``), the layout's ``m`` marks are checked here only.
"""

from __future__ import annotations

import re

from sim.base.errors import InfeasibleError, InputError

Layout = tuple[str, ...]
LAYER_CHARS = "EtmL"
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_REPEAT = re.compile(r"(.)\*(\d+)")
MAX_LAYOUT_CHARS = 1 << 16


def parse_layout(text: str, pp: int | None = None, *, field: str = "pipeline_layout") -> Layout:
    """Megatron's layout string -> one string of layer characters per virtual stage.  With
    ``pp``, the number of virtual stages must be a multiple of it (vp = stages / pp)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(field, text, "must be a layout string such as Et*3|(tt|)*29,m|L")
    raw = text.replace(",", "").replace(" ", "")
    expanded = raw
    for pattern in (_GROUP, _REPEAT):
        def unroll(mt: re.Match) -> str:
            n = int(mt.group(2))
            if n > MAX_LAYOUT_CHARS or len(mt.group(1)) * n > MAX_LAYOUT_CHARS:
                raise InputError(field, text, f"repeat count {n} is too large")
            return mt.group(1) * n
        expanded = pattern.sub(unroll, expanded)
        if len(expanded) > MAX_LAYOUT_CHARS:
            raise InputError(field, text, "expands to too many layers")
    stages = tuple(expanded.split("|"))
    for st in stages:
        bad = [c for c in st if c not in LAYER_CHARS]
        if bad:
            raise InputError(field, text, f"invalid layer character {bad[0]!r} (known: E embedding, t decoder "
                             "layer, m MTP layer, L loss; | splits stages, x*n and (...)*n repeat)")
    if pp is not None and len(stages) % pp:
        raise InputError(field, text, f"has {len(stages)} virtual stages, not a multiple of pp={pp}")
    return stages


def _stage_text(stage: str) -> str:
    out = []
    for mt in re.finditer(r"(.)\1*", stage):
        ch, n = mt.group(1), len(mt.group(0))
        out.append(f"{ch}*{n}" if n >= 3 else ch * n)
    return "".join(out)


def format_layout(layout: Layout) -> str:
    """The layout as Megatron layout text, runs of a layer as ``x*n`` and runs of equal stages
    as ``(s|)*n`` (no commas).  ``parse_layout(format_layout(x)) == x``."""
    parts: list[str] = []
    i, n = 0, len(layout)
    while i < n:
        j = i
        while j + 1 < n and layout[j + 1] == layout[i]:
            j += 1
        k, text = j - i + 1, _stage_text(layout[i])
        last = j == n - 1
        if k >= 3 and text:
            parts.append(f"({text}|)*{k - 1}{text}" if last else f"({text}|)*{k}")
        else:
            parts.append("".join(f"{text}|" for _ in range(k - 1)) + text + ("" if last else "|"))
        i = j + 1
    return "".join(parts)


def vp_of(layout: Layout, pp: int) -> int:
    return len(layout) // pp


def rank_chunks(layout: Layout, pp: int) -> list[list[str]]:
    """``[rank][chunk]`` layer strings (Megatron's 2-D layout)."""
    v = vp_of(layout, pp)
    return [[layout[c * pp + i] for c in range(v)] for i in range(pp)]


def chunk_layer_ids(layout: Layout, pp: int) -> list[list[list[int]]]:
    """``[rank][chunk]`` decoder layer indices, numbered in flat (virtual stage) order
    (Megatron's ``get_layer_offset``)."""
    v = vp_of(layout, pp)
    out = [[[] for _ in range(v)] for _ in range(pp)]
    nxt = 0
    for k, stage in enumerate(layout):
        c, i = divmod(k, pp)
        for ch in stage:
            if ch == "t":
                out[i][c].append(nxt)
                nxt += 1
    return out


def num_decoder_layers(layout: Layout) -> int:
    return sum(st.count("t") for st in layout)


def num_mtp_layers(layout: Layout) -> int:
    return sum(st.count("m") for st in layout)


def check_layout(layout: Layout, *, pp: int, num_layers: int, mtp_layers: int | None = None) -> None:
    """Megatron-Core's ``validate_layer_layout`` (module docstring); ``InfeasibleError``
    (reason ``layers``) naming the layout."""
    text = format_layout(layout)
    if len(layout) % pp:
        raise InfeasibleError("layers", "pipeline_layout", text, f"{len(layout)} virtual stages is not a multiple of pp={pp}")
    flat = "".join(layout)
    if not flat.startswith("E") or flat.count("E") != 1:
        raise InfeasibleError("layers", "pipeline_layout", text, "the embedding (E) must come first, exactly once")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise InfeasibleError("layers", "pipeline_layout", text, "the loss (L) must come last, exactly once")
    if flat.count("t") != num_layers:
        raise InfeasibleError("layers", "pipeline_layout", text,
                              f"holds {flat.count('t')} decoder layers (t), the model has num_layers={num_layers}")
    if "m" in flat:
        if "t" in flat[flat.index("m"):]:
            raise InfeasibleError("layers", "pipeline_layout", text, "MTP layers (m) must follow every decoder layer")
        chunks = rank_chunks(layout, pp)
        if any("m" in ch for row in chunks for ch in row[:-1]):
            raise InfeasibleError("layers", "pipeline_layout", text,
                                  "MTP layers (m) must sit in a rank's last model chunk (Megatron-Core)")
        if sum("m" in row[-1] for row in chunks) > 1:
            raise InfeasibleError("layers", "pipeline_layout", text, "all MTP layers must be in one model chunk")
    if mtp_layers is not None and flat.count("m") != mtp_layers:
        raise InfeasibleError("layers", "pipeline_layout", text,
                              f"holds {flat.count('m')} MTP layers (m), the recipe has mtp_num_layers={mtp_layers}")


def layout_from_counts(counts: list[list[int]], *, mtp: int = 0) -> Layout:
    """A layout from ``counts[rank][chunk]`` decoder layers: the embedding in rank 0's first
    chunk, the loss (after ``mtp`` MTP layers) in the last rank's last chunk."""
    pp, v = len(counts), len(counts[0])
    out = []
    for c in range(v):
        for i in range(pp):
            s = "t" * counts[i][c]
            if i == 0 and c == 0:
                s = "E" + s
            if i == pp - 1 and c == v - 1:
                s = s + "m" * mtp + "L"
            out.append(s)
    return tuple(out)


def layout_counts(layout: Layout, pp: int) -> list[list[int]]:
    """``[rank][chunk]`` decoder layer counts."""
    return [[ch.count("t") for ch in row] for row in rank_chunks(layout, pp)]


def megatron_layout(num_layers: int, pp: int, vp: int = 1, *, first: int | None = None, last: int | None = None,
                    account_embedding: bool = False, account_loss: bool = False,
                    field: str = "pipeline_layout") -> Layout:
    """The layout Megatron-Core builds without ``--pipeline-model-parallel-layout``
    (``get_num_layers_to_build``, core_v0.9.0+): ``first``/``last`` decoder layers on the first
    and last rank (``--decoder-first/last-pipeline-num-layers``), the rest split evenly over the
    middle ranks; or an even split with the embedding and loss counted as one layer each when
    ``account_*`` (``--account-for-embedding/loss-in-pipeline-split``); each rank's layers
    split evenly over its ``vp`` chunks.  ``InputError`` where Megatron-Core's asserts fail."""
    if pp < 1 or vp < 1:
        raise InputError(field, f"pp={pp}, vp={vp}", "must be >= 1")
    if (first is not None or last is not None) and (account_embedding or account_loss):
        raise InputError(field, "decoder-first/last-pipeline-num-layers", "cannot be combined with "
                         "account-for-embedding/loss-in-pipeline-split (Megatron-Core asserts)")
    per_rank = [0] * pp
    if first is not None or last is not None:
        rest, left = num_layers, pp
        if first is not None:
            rest, left = rest - first, left - 1
        if last is not None:
            rest, left = rest - last, left - 1
        if rest < 0 or (left > 0 and rest % left):
            raise InputError(field, f"first={first}, last={last}", f"the {rest} layers left must split evenly over "
                             f"the {left} middle pipeline stages (num_layers={num_layers}, pp={pp})")
        mid = rest // left if left > 0 else 0
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
        if left <= 0 and sum(per_rank) != num_layers:
            raise InputError(field, f"first={first}, last={last}", f"must sum to num_layers={num_layers} with pp={pp}")
    else:
        units = num_layers + int(account_embedding) + int(account_loss)
        if units % pp:
            raise InputError(field, num_layers, f"{units} layers (counting the embedding/loss when accounted) do not "
                             f"split evenly over pp={pp}")
        per_rank = [units // pp] * pp
    counts = []
    for i, n in enumerate(per_rank):
        if pp > 1 and vp > 1 and n % vp:
            raise InputError(field, n, f"layers of pipeline stage {i} must split evenly over vp={vp} model chunks")
        row = [n // vp] * vp if pp > 1 else [n] + [0] * (vp - 1)
        counts.append(row)
    if account_embedding:
        counts[0][0] -= 1
    if account_loss:
        counts[-1][-1] -= 1
    if any(c < 0 for row in counts for c in row):
        raise InputError(field, num_layers, "not enough layers for the embedding/loss stages")
    return layout_from_counts(counts)


def balanced_layout(num_layers: int, pp: int, vp: int, *, count_ends: bool) -> Layout | None:
    """An even layout of ``num_layers`` over ``pp * vp`` chunks, as the search tries for a
    framework that runs layouts: every chunk gets ``floor`` or ``ceil`` of the layers (with the
    embedding and the loss counted as one layer each when ``count_ends``, Megatron's
    ``--account-for-*-in-pipeline-split`` rule of thumb), the larger chunks spread over
    different ranks, middle ranks first (the end ranks hold the embedding and the loss).
    ``None`` when a chunk would be left with no layer (the embedding's and the loss's chunks may
    hold nothing else, as DeepSeek-V3's ``...|m|L``)."""
    v_total = pp * vp
    units = num_layers + (2 if count_ends else 0)
    base, extra = divmod(units, v_total)
    rank_order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    plus: set[tuple[int, int]] = set()
    k = 0
    # hand out extras round-robin over ranks (middle first), a different chunk each lap
    while len(plus) < extra:
        lap, pos = divmod(k, pp)
        i = rank_order[pos]
        c = (vp - 1 - lap) % vp if i == 0 else lap % vp
        plus.add((i, c))
        k += 1
    counts = [[base + ((i, c) in plus) for c in range(vp)] for i in range(pp)]
    if count_ends:
        counts[0][0] -= 1
        counts[-1][-1] -= 1
    ends = {(0, 0), (pp - 1, vp - 1)} if count_ends else set()
    if any(n < (0 if (i, c) in ends else 1) for i, row in enumerate(counts) for c, n in enumerate(row)):
        return None
    return layout_from_counts(counts)
