"""validate.workloads in one process (a one-rank gloo group): the memory peak starts after the
model is built, and no loss is read back to the host until the last step."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from validate import workloads  # noqa: E402
from validate.runtime import Env  # noqa: E402
from validate.specs import ModelConfig, WorkloadSpec  # noqa: E402

TINY = ModelConfig(name="tiny", num_layers=2, hidden_size=32, num_heads=2, ffn_hidden_size=64, vocab_size=64,
                   seq_len=16)


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Env(rank=0, world_size=1, local_rank=0, local_world_size=1, backend="gloo", device=torch.device("cpu"),
              threads=1)
    dist.destroy_process_group()


def test_memory_peak_starts_after_the_build_and_losses_stay_on_the_device(one_rank, monkeypatch):
    order = []

    class Recorder:
        def __init__(self, device):
            pass

        def before_build(self):
            order.append("before_build")

        def after_build(self):
            order.append("after_build")

        def result(self):
            order.append("result")
            return {"peak_bytes": 1.0}

    real_build, real_step = workloads.build, workloads.train_step
    reads = []

    def build(spec, env):
        order.append("build")
        return real_build(spec, env)

    def step(spec, env, built, i):
        order.append("step")
        # float(loss) per micro-batch was the stall (the optimizer's own .item() on its step count is not)
        monkeypatch.setattr(torch.Tensor, "__float__", lambda self: reads.append("float") or 0.0)
        try:
            out = real_step(spec, env, built, i)
        finally:
            monkeypatch.undo()
            monkeypatch.setattr(workloads, "PeakMemory", Recorder)
            monkeypatch.setattr(workloads, "build", build)
            monkeypatch.setattr(workloads, "train_step", step)
        assert isinstance(out, torch.Tensor)
        return out

    monkeypatch.setattr(workloads, "PeakMemory", Recorder)
    monkeypatch.setattr(workloads, "build", build)
    monkeypatch.setattr(workloads, "train_step", step)
    spec = WorkloadSpec(name="accum", model=TINY, mbs=1, num_microbatches=4, warmup_steps=1, steps=2)
    res = workloads.run(spec, one_rank)
    assert order == ["before_build", "build", "after_build", "step", "step", "step", "result"]
    assert reads == []  # four micro-batches per step, no host read of a loss
    assert res["kind"] == "single" and res["loss_first"] > 0 and res["measured_memory_peak_bytes"] == 1.0
