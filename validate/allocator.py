"""A replay of PyTorch's CUDA caching allocator over an allocation trace: the reserved level.

``torch.cuda.max_memory_reserved`` exceeds ``max_memory_allocated`` because the caching
allocator rounds requests, carves them out of larger segments and keeps freed blocks cached
for reuse by requests that fit; a free block between two live ones is usable only by a request
no larger than it.  How much that costs depends on the order and the sizes of the allocations
of a training step, so it is measured by replaying the step's trace (``validate.memtrack``
records one under ``FakeTensorMode``) through the allocator's rules, as PyTorch 2.x implements
them in ``c10/cuda/CUDACachingAllocator.cpp``:

* sizes are rounded up to 512 B (``kMinBlockSize``; ``round_size``);
* requests up to 1 MiB (``kSmallSize``) come from the small pool, the rest from the large pool;
* a miss allocates a segment of 2 MiB (``kSmallBuffer``) for small requests, 20 MiB
  (``kLargeBuffer``) for requests under 10 MiB (``kMinLargeAlloc``), else the request rounded
  up to 2 MiB (``kRoundLarge``) (``get_allocation_size``);
* a request takes the smallest cached free block of its pool that is large enough (best fit,
  ``get_free_block``: the pool's blocks ordered by size, then address; ``lower_bound``);
* the block is split when the rest is at least 512 B (small pool) or more than 1 MiB (large
  pool) (``should_split``), the request taking the front;
* a freed block merges with free neighbours of its segment (``free_block`` /
  ``try_merge_blocks``); nothing is returned to the device (no ``empty_cache``, no OOM retry).

``expandable_segments:True`` (``PYTORCH_CUDA_ALLOC_CONF``; torchtitan's ``run_train.sh`` sets
it) replaces the large pool's per-miss segments by one segment per pool that grows at its end
(``try_allocate_expandable_block``): a miss maps just enough 20 MiB pages (``kLargeBuffer``
granularity of ``ExpandableSegment``) to extend the free tail to the request, so memory is lost
only to holes between live blocks.

Known simplifications: one stream (the allocator keeps a separate cache per stream; FSDP2's
all-gather and reduce-scatter buffers live on their own streams and cannot reuse the compute
stream's blocks, so this replay under-states fragmentation with FSDP), and the trace is the
order in which the tracker saw tensors created and freed (Python reference counting), which is
the order of the eager step.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

MIN_BLOCK_BYTES = 512
SMALL_SIZE_BYTES = 1 << 20
SMALL_BUFFER_BYTES = 2 << 20
MIN_LARGE_ALLOC_BYTES = 10 << 20
ROUND_LARGE_BYTES = 2 << 20
LARGE_BUFFER_BYTES = 20 << 20


def round_size(nbytes: int) -> int:
    """``round_size``: 512 B granules."""
    return MIN_BLOCK_BYTES if nbytes < MIN_BLOCK_BYTES else MIN_BLOCK_BYTES * math.ceil(nbytes / MIN_BLOCK_BYTES)


def allocation_size(nbytes: int) -> int:
    """``get_allocation_size``: the segment a miss allocates for a rounded request."""
    if nbytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if nbytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return ROUND_LARGE_BYTES * math.ceil(nbytes / ROUND_LARGE_BYTES)


@dataclass(eq=False)
class _Block:
    segment: int
    address: int
    size: int
    small: bool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None

    def key(self) -> tuple[int, int]:
        return (self.size, self.address)


@dataclass
class _Pool:
    small: bool
    keys: list[tuple[int, int]] = field(default_factory=list)  # free blocks, sorted (size, address)
    blocks: dict[tuple[int, int], _Block] = field(default_factory=dict)

    def insert(self, b: _Block) -> None:
        k = b.key()
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: _Block) -> None:
        k = b.key()
        del self.keys[bisect.bisect_left(self.keys, k)]
        del self.blocks[k]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.keys, (size, -1))
        return self.blocks[self.keys[i]] if i < len(self.keys) else None


class CachingAllocator:
    """The allocator's bookkeeping on one device and one stream; ``reserved_bytes`` and
    ``allocated_bytes`` with their peaks."""

    def __init__(self, *, expandable_segments: bool = False) -> None:
        self.expandable = expandable_segments
        self.pools = {True: _Pool(small=True), False: _Pool(small=False)}
        self.live: dict[int, _Block] = {}
        self.reserved_bytes = self.allocated_bytes = 0
        self.peak_reserved_bytes = self.peak_allocated_bytes = 0
        self._next_address = 0
        self._segments = 0
        self._tail: _Block | None = None  # expandable: the last block of the large pool's segment

    def malloc(self, handle: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE_BYTES
        pool = self.pools[small]
        b = pool.best_fit(size)
        if b is not None:
            pool.remove(b)
        elif self.expandable and not small:
            b = self._grow(size)
        else:
            b = self._segment(allocation_size(size))
        remaining = b.size - size
        if (remaining >= MIN_BLOCK_BYTES) if small else (remaining > SMALL_SIZE_BYTES):
            rest = _Block(b.segment, b.address + size, remaining, b.small, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next, b.size = rest, size
            if self._tail is b:
                self._tail = rest
            pool.insert(rest)
        b.free = False
        self.live[handle] = b
        self.allocated_bytes += b.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)

    def free(self, handle: int) -> None:
        b = self.live.pop(handle)
        self.allocated_bytes -= b.size
        pool = self.pools[b.small]
        b.free = True
        for other in (b.prev, b.next):
            if other is not None and other.free and other.segment == b.segment:
                pool.remove(other)
                b = self._absorb(other, b) if other is b.prev else self._absorb(b, other)
        pool.insert(b)

    def _absorb(self, left: _Block, right: _Block) -> _Block:
        """Merge ``right`` into its neighbour ``left`` (``try_merge_blocks``)."""
        left.size += right.size
        left.next = right.next
        if right.next is not None:
            right.next.prev = left
        if self._tail is right:
            self._tail = left
        return left

    def _segment(self, size: int) -> _Block:
        self._segments += 1
        b = _Block(self._segments, self._next_address, size, small=size == SMALL_BUFFER_BYTES)
        self._next_address += size + (1 << 40)  # segments are never adjacent
        self._reserve(size)
        return b

    def _grow(self, size: int) -> _Block:
        """Expandable segment: extend the free tail (or a new tail) by whole 20 MiB pages."""
        tail = self._tail
        have = tail.size if tail is not None and tail.free else 0
        pages = math.ceil((size - have) / LARGE_BUFFER_BYTES)
        grow = pages * LARGE_BUFFER_BYTES
        self._reserve(grow)
        if have:
            self.pools[False].remove(tail)
            tail.size += grow
            return tail
        address = tail.address + tail.size if tail is not None else 0
        b = _Block(0, address, grow, small=False, prev=tail)
        if tail is not None:
            tail.next = b
        self._tail = b
        return b

    def _reserve(self, size: int) -> None:
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)


def replay(events: list[tuple[str, int, int]], *, expandable_segments: bool = False) -> dict[str, float]:
    """Replay ``events`` (``("alloc", handle, bytes)`` / ``("free", handle, 0)``) and return the
    peaks: ``allocated_bytes``, ``reserved_bytes`` and ``fragmentation`` (reserved / allocated - 1)."""
    a = CachingAllocator(expandable_segments=expandable_segments)
    for kind, handle, nbytes in events:
        if kind == "alloc":
            a.malloc(handle, nbytes)
        elif handle in a.live:
            a.free(handle)
    alloc, res = float(a.peak_allocated_bytes), float(a.peak_reserved_bytes)
    return {"allocated_bytes": alloc, "reserved_bytes": res, "fragmentation": res / alloc - 1 if alloc else 0.0}
