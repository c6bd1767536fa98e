"""The CUDA-only code paths of validate/, run on this CPU machine against a fake GPU.

``FakeGpu`` is a stream model: every launched kernel costs the host ``dispatch_s`` and runs on
the GPU after the previous one (and no earlier than its launch); events take the GPU clock
when the stream reaches them; synchronising moves the host clock to the GPU's.  The real
functions (validate.timing, validate.memstats) run unchanged against it through monkeypatched
``torch.cuda`` entry points.
"""

import pytest

torch = pytest.importorskip("torch")

from validate import timing  # noqa: E402

CUDA = torch.device("cuda", 0)


class FakeGpu:
    def __init__(self, dispatch_s: float, sleep_s_per_cycle: float = 1e-9) -> None:
        self.host = 0.0
        self.gpu = 0.0
        self.dispatch_s = dispatch_s
        self.per_cycle = sleep_s_per_cycle
        self.event_syncs = 0
        self.device_syncs = 0
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t = None

            def record(self) -> None:
                self.t = max(gpu.gpu, gpu.host)
                gpu.gpu = self.t

            def synchronize(self) -> None:
                gpu.event_syncs += 1
                gpu.host = max(gpu.host, self.t)

            def elapsed_time(self, end: "Event") -> float:
                return (end.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event

        self.Event = Event

    def kernel(self, seconds: float) -> None:
        self.host += self.dispatch_s
        self.gpu = max(self.gpu, self.host) + seconds

    def sleep(self, cycles: int) -> None:
        self.kernel(cycles * self.per_cycle)

    def synchronize(self, device=None) -> None:
        self.device_syncs += 1
        self.host = max(self.host, self.gpu)

    def perf_counter(self) -> float:
        return self.host


@pytest.fixture
def fake(monkeypatch):
    def make(dispatch_s):
        g = FakeGpu(dispatch_s)
        monkeypatch.setattr(torch.cuda, "Event", g.Event)
        monkeypatch.setattr(torch.cuda, "synchronize", g.synchronize)
        monkeypatch.setattr(torch.cuda, "_sleep", g.sleep)

        class Clock:
            perf_counter = staticmethod(g.perf_counter)

        monkeypatch.setattr(timing, "time", Clock)
        return g
    return make


def test_batches_are_timed_with_events_and_one_sync(fake):
    """A 10 us kernel whose launch costs the host 3 us: back-to-back calls cost 10 us each on the
    GPU (the host runs ahead), with one synchronisation per batch, none per call."""
    g = fake(3e-6)
    t = timing.batch_s(lambda: g.kernel(10e-6), 100, CUDA)
    assert t / 100 == pytest.approx(10e-6, rel=0.01)
    assert g.event_syncs == 1 and g.device_syncs == 0
    n = timing.calls_for(10e-6, 0.03, samples=3, max_calls=10000)
    assert n == 1000


def test_a_host_bound_op_shows_its_dispatch(fake):
    """A 1 us kernel launched every 8 us: the stream waits for the host, and host_s sees 8 us."""
    g = fake(8e-6)
    assert timing.host_s(lambda: g.kernel(1e-6), CUDA, n=500) == pytest.approx(8e-6, rel=0.01)


def test_queued_time_is_the_kernel_not_the_launch(fake):
    """With a spin kernel holding the stream while the host enqueues, a 2 us no-work kernel
    measures 2 us although its launch costs the host 8 us: kernel_overhead_s = 2 us and
    host_op_floor_s = 8 - 2 = 6 us (validate.fit), not the 8-15 us of launch + sync."""
    from validate.fit import fit_host_floor, fit_overhead

    g = fake(8e-6)
    q = timing.queued_s(lambda: g.kernel(2e-6), CUDA, n=1000)
    h = timing.host_s(lambda: g.kernel(2e-6), CUDA, n=1000)
    assert q == pytest.approx(2e-6, rel=0.01) and h == pytest.approx(8e-6, rel=0.01)
    recs = [{"kind": "overhead", "op": "queued_add", "time_s": q}, {"kind": "overhead", "op": "eager_add", "time_s": h}]
    assert fit_overhead(recs) == pytest.approx(2e-6, rel=0.01)
    assert fit_host_floor(recs, fit_overhead(recs)) == pytest.approx(6e-6, rel=0.02)


def test_cpu_path_needs_no_cuda():
    t = timing.batch_s(lambda: None, 10, torch.device("cpu"))
    assert 0 <= t < 0.1


class FakeAllocator:
    """Allocated / reserved bytes with peaks, as torch.cuda's caching allocator reports them."""

    def __init__(self, total: float) -> None:
        self.total, self.alloc, self.reserved, self.outside = total, 0.0, 0.0, 0.5e9
        self.peak_alloc = self.peak_reserved = 0.0

    def malloc(self, n: float) -> None:
        self.alloc += n
        self.reserved = max(self.reserved, self.alloc * 1.1)
        self.peak_alloc = max(self.peak_alloc, self.alloc)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: float) -> None:
        self.alloc -= n

    def install(self, mp) -> None:
        c = torch.cuda
        mp.setattr(c, "synchronize", lambda d=None: None)
        mp.setattr(c, "empty_cache", lambda: setattr(self, "reserved", self.alloc * 1.1))
        mp.setattr(c, "memory_allocated", lambda d=None: self.alloc)
        mp.setattr(c, "memory_reserved", lambda d=None: self.reserved)
        mp.setattr(c, "max_memory_allocated", lambda d=None: self.peak_alloc)
        mp.setattr(c, "max_memory_reserved", lambda d=None: self.peak_reserved)

        def reset(d=None):
            self.peak_alloc, self.peak_reserved = self.alloc, self.reserved

        mp.setattr(c, "reset_peak_memory_stats", reset)
        mp.setattr(c, "mem_get_info", lambda d=None: (self.total - self.reserved - self.outside, self.total))


def test_peak_memory_starts_after_the_build(monkeypatch):
    """Each rank builds the unsharded model (8 GB) and shards it (4 GB kept); training peaks at
    4 + 3 GB.  The recorded peak is 7 GB allocated, not the 8+ GB of the build, and the reserved
    peak and the memory outside the allocator (context, NCCL) are recorded too."""
    from validate.memstats import PeakMemory

    a = FakeAllocator(total=141e9)
    a.install(monkeypatch)
    mem = PeakMemory(CUDA)
    mem.before_build()
    a.malloc(8e9)  # the full model
    a.malloc(4e9)  # the shards
    a.free(8e9)
    mem.after_build()
    a.malloc(3e9)  # activations, gradients, optimizer states of the steps
    a.free(3e9)
    r = mem.result()
    assert r["peak_bytes"] == pytest.approx(7e9)
    assert r["peak_reserved_bytes"] == pytest.approx(7.7e9)
    assert r["outside_allocator_bytes"] == pytest.approx(0.5e9)
    assert r["device_used_bytes"] == pytest.approx(a.reserved + 0.5e9)


def test_fsdp_runs_with_bf16_params_and_fp32_reduction_on_gpus(monkeypatch):
    from torch.distributed import fsdp

    from validate import workloads
    from validate.model import GPT
    from validate.specs import ModelConfig

    mp = workloads.fsdp_mixed_precision(CUDA)
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32
    assert workloads.fsdp_mixed_precision(torch.device("cpu")) is None
    seen = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda m, **kw: seen.append(kw) or m)
    model = GPT(ModelConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=64, seq_len=8))
    workloads._apply_fsdp(model, None, pipelined=False, device=CUDA)
    assert len(seen) == 3 and all(kw["mp_policy"] is mp or kw["mp_policy"] == mp for kw in seen)


def test_the_residual_stream_stays_in_bf16_under_autocast():
    """CUDA autocast runs layer_norm in fp32 (it is on the "autocast to float32" list); the
    workloads' norms return their input's dtype and the embedding output is cast, so under
    autocast every block input and output (what TP gathers and pipelines send) is bf16."""
    from validate.model import GPT
    from validate.specs import ModelConfig

    model = GPT(ModelConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=64, seq_len=8))
    model.autocast_dtype = torch.bfloat16
    dtypes = []
    for block in model.layers.values():
        block.register_forward_hook(lambda m, i, o: dtypes.append((i[0].dtype, o.dtype)))
        block.attention_norm.register_forward_hook(lambda m, i, o: dtypes.append((o.dtype,)))
    model.norm.register_forward_hook(lambda m, i, o: dtypes.append((o.dtype,)))
    logits = model(torch.randint(0, 64, (2, 8)))
    assert dtypes and all(d == torch.bfloat16 for t in dtypes for d in t), dtypes
    assert logits.dtype == torch.bfloat16
    norm = model.layers["0"].ffn_norm
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(torch.randn(2, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16
        assert norm(torch.randn(2, 32)).dtype == torch.float32  # it follows its input, not autocast
