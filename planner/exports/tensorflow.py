"""A Keras training script for a plan on TensorFlow's ``tf.distribute`` (``--export tensorflow``).

Files: ``train_keras.py`` (always) and, across machines, ``tf_configs.json`` (the ``TF_CONFIG``
value of every task, keyed ``worker-0``, ``ps-0``, ``chief-0``, ...) with ``launch_tf.sh`` (exports
one task's ``TF_CONFIG`` and runs the script).  The strategy follows the plan
(``profile_for``, each a profile of ``catalogs/frameworks.yaml``):

* one node, gradient reduction after the backward (``dp_overlap=0``): ``MirroredStrategy`` with
  ``NcclAllReduce(num_packs=1)`` (``tf-mirrored``);
* several nodes, or ``dp_overlap=1``: ``MultiWorkerMirroredStrategy`` with
  ``CommunicationOptions(implementation=NCCL, bytes_per_pack=BYTES_PER_PACK)``: 0 packs every
  gradient into one all-reduce after the backward, a positive size launches each pack as its
  gradients are ready (``tf-multiworker``; 25 MiB, PyTorch DDP's default bucket, when overlapping);
* ``dp_impl=parameter-server``: ``ParameterServerStrategy`` with a ``ClusterCoordinator`` custom
  loop, ``MinSizePartitioner(max_shards=NUM_PS)`` (``even``) or no partitioner (``round-robin``),
  variable reads cached per worker step (``tf-parameter-server``).

The plan is written as module constants the script uses and ``planner.exports.readback`` reads
back: ``PER_REPLICA_BATCH_SIZE`` (``mbs``), ``GRADIENT_ACCUMULATION_STEPS`` (micro-batches the train
step accumulates per replica in float32 before one ``apply_gradients``, ``None`` for one; Keras'
own ``gradient_accumulation_steps`` puts the all-reduce inside a ``cond``, which ``tf.distribute``
refuses), ``GLOBAL_BATCH_SIZE`` (``gbs``),
``SEQ_LEN``, ``MIXED_PRECISION_POLICY`` (``mixed_bfloat16`` / ``mixed_float16``), ``RECOMPUTE``
(``tf.recompute_grad`` around the attention core for ``selective``, around every block for
``full``).  The model is a decoder-only Keras transformer of the plan's shape (RMS or layer norm,
RoPE or learned positions, GQA, SwiGLU or GeLU, no biases) whose variables are the ones
``sim.engines.parameter_server.keras_variables`` lists, in the same order; MoE and MLA models are refused
(no Keras layers for them).  Data: synthetic tokens unless ``DATA_FILES`` names TFRecord files of
``SEQ_LEN + 1`` int64 ``tokens``; replace ``make_dataset`` for real data.
"""

from __future__ import annotations

import json

from sim.base.errors import InputError
from sim.data.psspecs import ParameterServers

from planner.exports import LaunchSpec, Rendered

PORT = 2222
OVERLAP_BYTES_PER_PACK = 25 << 20  # PyTorch DDP's default bucket (bucket_cap_mb=25)
POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def profile_for(spec: LaunchSpec) -> str:
    """The framework profile the script for ``spec`` runs (module docstring)."""
    s = spec.strategy
    if s.dp_impl == "parameter-server":
        return "tf-parameter-server"
    return "tf-mirrored" if spec.num_nodes == 1 and not s.dp_overlap else "tf-multiworker"


def strategy_class(spec: LaunchSpec) -> str:
    return {"tf-parameter-server": "ParameterServerStrategy", "tf-mirrored": "MirroredStrategy",
            "tf-multiworker": "MultiWorkerMirroredStrategy"}[profile_for(spec)]


def tf_configs(spec: LaunchSpec, num_ps: int) -> dict[str, dict]:
    """``TF_CONFIG`` of every task: workers are the nodes (host names as a Kubeflow ``TFJob``
    names its pods' services, ``<job>-<type>-<index>``: replace them with yours); a
    parameter-server cluster adds ``num_ps`` PS tasks and a ``chief`` (the coordinator)."""
    cls = strategy_class(spec)

    def hosts(kind: str, n: int) -> list[str]:
        return [f"{spec.job_name}-{kind}-{i}:{PORT}" for i in range(n)]

    cluster: dict[str, list[str]] = {"worker": hosts("worker", spec.num_nodes)}
    if cls == "ParameterServerStrategy":
        cluster = {"chief": hosts("chief", 1), **cluster, "ps": hosts("ps", num_ps)}
    return {f"{kind}-{i}": {"cluster": cluster, "task": {"type": kind, "index": i}}
            for kind, members in cluster.items() for i in range(len(members))}


def _model_config(spec: LaunchSpec) -> dict[str, object]:
    m = spec.model
    if m.moe is not None or m.is_mla:
        raise InputError("export", "tensorflow", f"{m.name} has {'experts' if m.moe is not None else 'MLA'}: the "
                         "Keras skeleton builds dense decoder models (Keras has no MoE or MLA layers)")
    if m.local_attention_layers:
        raise InputError("export", "tensorflow", f"{m.name} has {m.local_attention_layers} sliding-window layers "
                         f"(window {m.local_attention_window}): the Keras skeleton's layers attend the whole causal "
                         "prefix")
    return {"num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_heads": m.num_attention_heads,
            "num_kv_heads": m.kv_heads, "head_dim": m.dim_per_head, "ffn_hidden_size": m.ffn_hidden_size,
            "ffn_type": m.ffn_type, "vocab_size": m.vocab_size, "tied_embeddings": m.tied_embeddings,
            "rope": m.uses_rope, "norm": "rms" if m.ffn_type == "swiglu" else "layer"}


_MODEL_CODE = '''
def norm_layer(name):
    # scale only (no bias), as the planner counts parameters
    if MODEL["norm"] == "rms":
        return keras.layers.RMSNormalization(epsilon=1e-5, name=name)
    return keras.layers.LayerNormalization(epsilon=1e-5, center=False, name=name)


def rope(x, positions):
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (tf.range(0, d, 2, dtype=tf.float32) / d))
    angles = tf.cast(positions, tf.float32)[:, None] * inv[None, :]
    sin, cos = tf.cast(tf.sin(angles), x.dtype)[None, :, None, :], tf.cast(tf.cos(angles), x.dtype)[None, :, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return tf.reshape(tf.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1), tf.shape(x))


def attention_core(q, k, v):
    """Causal scaled dot-product attention, scores materialised (Keras on TensorFlow has no
    fused attention kernel), softmax in float32."""
    groups = MODEL["num_heads"] // MODEL["num_kv_heads"]
    k, v = tf.repeat(k, groups, axis=2), tf.repeat(v, groups, axis=2)
    scores = tf.einsum("bqhd,bkhd->bhqk", q, k) / tf.math.sqrt(tf.cast(MODEL["head_dim"], q.dtype))
    n = tf.shape(scores)[-1]
    causal = tf.linalg.band_part(tf.ones((n, n), tf.bool), -1, 0)
    scores = tf.where(causal, tf.cast(scores, tf.float32), tf.float32.min)
    probs = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
    return tf.einsum("bhqk,bkhd->bqhd", probs, v)


class Block(keras.layers.Layer):
    """One decoder layer; variables created in the order sim.engines.parameter_server.keras_variables
    lists them (attention norm, q, k, v, o, FFN norm, [gate,] up, down)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        h, q, kv, f = MODEL["hidden_size"], MODEL["num_heads"] * MODEL["head_dim"], \\
            MODEL["num_kv_heads"] * MODEL["head_dim"], MODEL["ffn_hidden_size"]
        self.attn_norm = norm_layer("attn_norm")
        self.wq = keras.layers.Dense(q, use_bias=False, name="q")
        self.wk = keras.layers.Dense(kv, use_bias=False, name="k")
        self.wv = keras.layers.Dense(kv, use_bias=False, name="v")
        self.wo = keras.layers.Dense(h, use_bias=False, name="o")
        self.ffn_norm = norm_layer("ffn_norm")
        self.gate = keras.layers.Dense(f, use_bias=False, name="gate") if MODEL["ffn_type"] == "swiglu" else None
        self.up = keras.layers.Dense(f, use_bias=False, name="up")
        self.down = keras.layers.Dense(h, use_bias=False, name="down")
        self.core = tf.recompute_grad(attention_core) if RECOMPUTE == "selective" else attention_core

    def build(self, input_shape):
        h, q, f = MODEL["hidden_size"], MODEL["num_heads"] * MODEL["head_dim"], MODEL["ffn_hidden_size"]
        self.attn_norm.build(input_shape)
        for layer in (self.wq, self.wk, self.wv):
            layer.build(input_shape)
        self.wo.build(input_shape[:-1] + (q,))
        self.ffn_norm.build(input_shape)
        for layer in (self.gate, self.up):
            if layer is not None:
                layer.build(input_shape)
        self.down.build(input_shape[:-1] + (f,))

    def call(self, x):
        b, s = tf.shape(x)[0], tf.shape(x)[1]
        hd, heads, kv_heads = MODEL["head_dim"], MODEL["num_heads"], MODEL["num_kv_heads"]
        y = self.attn_norm(x)
        q = tf.reshape(self.wq(y), (b, s, heads, hd))
        k = tf.reshape(self.wk(y), (b, s, kv_heads, hd))
        v = tf.reshape(self.wv(y), (b, s, kv_heads, hd))
        if MODEL["rope"]:
            positions = tf.range(s)
            q, k = rope(q, positions), rope(k, positions)
        x = x + self.wo(tf.reshape(self.core(q, k, v), (b, s, heads * hd)))
        y = self.ffn_norm(x)
        if self.gate is not None:
            y = tf.nn.silu(self.gate(y)) * self.up(y)
        else:
            y = tf.nn.gelu(self.up(y))
        return x + self.down(y)


class Decoder(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        h, vocab = MODEL["hidden_size"], MODEL["vocab_size"]
        self.embed = keras.layers.Embedding(vocab, h, name="embedding")
        self.positions = None if MODEL["rope"] else keras.layers.Embedding(SEQ_LEN, h, name="positions")
        self.blocks = [Block(name=f"layer{i}") for i in range(MODEL["num_layers"])]
        self.final_norm = norm_layer("final_norm")
        # logits in float32 (Keras mixed-precision guide: keep the last layer float32)
        self.head = None if MODEL["tied_embeddings"] else \\
            keras.layers.Dense(vocab, use_bias=False, dtype="float32", name="lm_head")

    def call(self, tokens):
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(tf.range(tf.shape(tokens)[1]))[None]
        for block in self.blocks:
            x = tf.recompute_grad(block)(x) if RECOMPUTE == "full" else block(x)
        x = self.final_norm(x)
        if self.head is None:
            return tf.matmul(tf.cast(x, tf.float32), tf.cast(self.embed.embeddings, tf.float32), transpose_b=True)
        return self.head(x)


def build_model():
    model = Decoder(name="decoder")
    model(tf.zeros((1, SEQ_LEN), tf.int32))  # create the variables (on the PS tasks under ParameterServerStrategy)
    return model


def make_dataset(batch_size, input_context=None):
    """(tokens, labels) of SEQ_LEN, batch_size sequences per element: TFRecord files of
    SEQ_LEN + 1 int64 `tokens` when DATA_FILES is set, else synthetic.  tf.data runs on the
    host and prefetches ahead of the step."""
    files = os.environ.get("DATA_FILES")
    if files:
        ds = tf.data.Dataset.list_files(files, shuffle=True)
        if input_context is not None:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        ds = ds.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)
        spec = {"tokens": tf.io.FixedLenFeature([SEQ_LEN + 1], tf.int64)}
        ds = ds.map(lambda r: tf.cast(tf.io.parse_single_example(r, spec)["tokens"], tf.int32),
                    num_parallel_calls=tf.data.AUTOTUNE).repeat()
    else:
        ds = tf.data.Dataset.range(1 << 62).map(
            lambda i: tf.random.stateless_uniform((SEQ_LEN + 1,), seed=tf.stack([i, 0]),
                                                  maxval=MODEL["vocab_size"], dtype=tf.int32))
    ds = ds.map(lambda t: (t[:-1], t[1:])).batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def make_optimizer():
    # the train step accumulates micro-batches itself: Keras' own gradient_accumulation_steps puts
    # the all-reduce inside a cond, which tf.distribute cannot run (merge_call in a cond)
    optimizer = keras.optimizers.Adam(learning_rate=3e-4)
    if MIXED_PRECISION_POLICY == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
'''

_SYNC_MAIN = '''

def main():
    strategy = make_strategy()
    assert strategy.num_replicas_in_sync == NUM_REPLICAS, (strategy.num_replicas_in_sync, NUM_REPLICAS)
    with strategy.scope():
        model = build_model()
        optimizer = make_optimizer()
        per_example_loss = loss_fn()
    # one element = one micro-batch of this replica; tf.data prefetches on the host
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: make_dataset(ctx.get_per_replica_batch_size(PER_REPLICA_BATCH_SIZE * NUM_REPLICAS), ctx))
    iterator = iter(dataset)

    def micro_step(batch, accumulated):
        tokens, labels = batch
        with tf.GradientTape() as tape:
            logits = model(tokens, training=True)
            per_sequence = tf.reduce_mean(per_example_loss(labels, logits), axis=-1)
            loss = tf.nn.compute_average_loss(per_sequence, global_batch_size=GLOBAL_BATCH_SIZE)
            scaled = optimizer.scale_loss(loss)  # LossScaleOptimizer under mixed_float16
        # dense gradients of static shape (the embedding's IndexedSlices too): packed and all-reduced
        # like every other (an unknown shape would put every gradient in one pack)
        grads = [tf.ensure_shape(tf.convert_to_tensor(g), v.shape)
                 for g, v in zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)]
        if accumulated is None:
            return grads, loss
        # gradient accumulation on this replica in float32, no communication (the variables' dtype)
        return [a + g for a, g in zip(accumulated, grads)], loss

    def apply_step(grads):
        # all-reduce (the strategy's cross-device ops) and the Adam update of every replica
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function(jit_compile=False)  # Keras turns XLA off under tf.distribute too
    def train_step(iterator):
        grads, losses = None, []
        for _ in range(GRADIENT_ACCUMULATION_STEPS or 1):  # micro-batches, unrolled
            grads, loss = strategy.run(micro_step, args=(next(iterator), grads))
            losses.append(strategy.reduce("SUM", loss, axis=None))
        strategy.run(apply_step, args=(grads,))
        return tf.add_n(losses)

    for step in range(TRAIN_STEPS):
        loss = train_step(iterator)
        if step % 10 == 0 or step == TRAIN_STEPS - 1:
            print(f"step {step}: loss {float(loss):.4f}", flush=True)


if __name__ == "__main__":
    main()
'''

_PS_MAIN = '''

def main():
    strategy = make_strategy()
    if strategy is None:  # a worker or PS task serves until the chief is done
        return
    assert strategy.num_replicas_in_sync == GPUS_PER_WORKER, strategy.num_replicas_in_sync
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model()
        optimizer = make_optimizer()
        per_example_loss = loss_fn()

    def dataset_fn(input_context):
        return make_dataset(input_context.get_per_replica_batch_size(PER_REPLICA_BATCH_SIZE * GPUS_PER_WORKER),
                            input_context)

    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)))

    @tf.function
    def worker_step(iterator):
        # one read of every variable per worker step, shared by the worker's GPUs
        # (ps_values.CachingVariable; as in TF's cluster_coordinator_test testVariableCaching)
        with distribute_utils.cache_variable_reads():
            def replica_step(batch):
                tokens, labels = batch
                with tf.GradientTape() as tape:
                    logits = model(tokens, training=True)
                    per_sequence = tf.reduce_mean(per_example_loss(labels, logits), axis=-1)
                    loss = tf.nn.compute_average_loss(per_sequence,
                                                      global_batch_size=PER_REPLICA_BATCH_SIZE * GPUS_PER_WORKER)
                    scaled = optimizer.scale_loss(loss)  # LossScaleOptimizer under mixed_float16
                # dense gradients of static shape (the embedding's IndexedSlices too): every parameter pushed
                grads = [tf.ensure_shape(tf.convert_to_tensor(g), v.shape)
                         for g, v in zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)]
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss
            return strategy.reduce("SUM", strategy.run(replica_step, args=(next(iterator),)), axis=None)

    # asynchronous: every scheduled step is one worker's update, nobody waits for the others
    for step in range(TRAIN_STEPS * NUM_WORKERS):
        loss = coordinator.schedule(worker_step, args=(iterator,))
    coordinator.join()
    print(f"{TRAIN_STEPS * NUM_WORKERS} updates; last loss {float(loss.fetch()):.4f}", flush=True)


if __name__ == "__main__":
    main()
'''


def _constants(spec: LaunchSpec, ps: ParameterServers | None) -> list[str]:
    s = spec.strategy
    if s.precision not in POLICIES:
        raise InputError("export", "tensorflow", f"precision={s.precision}: Keras mixed precision has "
                         "mixed_bfloat16 and mixed_float16 policies")
    acc = s.num_microbatches
    lines = [
        f"MODEL = {json.dumps(_model_config(spec), indent=4).replace('true', 'True').replace('false', 'False')}",
        f"NUM_REPLICAS = {s.dp}  # GPUs training in sync (workers x GPUs per worker)",
        f"NUM_WORKERS = {spec.num_nodes}",
        f"GPUS_PER_WORKER = {spec.procs_per_node}",
        f"PER_REPLICA_BATCH_SIZE = {s.mbs}  # sequences per GPU per micro-batch",
        f"GRADIENT_ACCUMULATION_STEPS = {acc if acc > 1 else None}  # micro-batches per update (None: one)",
        f"GLOBAL_BATCH_SIZE = {s.gbs}  # sequences per update"
        + ("" if s.dp_impl != "parameter-server" else " of all workers together (each applies its own)"),
        f"SEQ_LEN = {s.seq_len}",
        f"MIXED_PRECISION_POLICY = {POLICIES[s.precision]!r}",
        f"RECOMPUTE = {s.recompute!r}  # none | selective (attention core) | full (every block)",
        f"TRAIN_STEPS = {spec.steps if spec.steps is not None else 1000}  # optimizer updates per worker",
    ]
    if strategy_class(spec) == "MultiWorkerMirroredStrategy":
        lines.append(f"BYTES_PER_PACK = {OVERLAP_BYTES_PER_PACK if s.dp_overlap else 0}  "
                     "# 0: one gradient pack after the backward; > 0: packs all-reduced as they are ready")
    if ps is not None:
        lines.append(f"NUM_PS = {ps.num_ps if ps.num_ps is not None else spec.num_nodes}")
        lines.append(f"PS_PARTITION = {ps.partition!r}  # even: MinSizePartitioner over all PS; "
                     "round-robin: whole variables")
    return lines


def _strategy_code(spec: LaunchSpec) -> str:
    cls = strategy_class(spec)
    if cls == "MirroredStrategy":
        return '''

def make_strategy():
    # NCCL all-reduce of every gradient concatenated into one pack after the backward
    return tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce(num_packs=1))
'''
    if cls == "MultiWorkerMirroredStrategy":
        return '''

def make_strategy():
    # TF_CONFIG (launch_tf.sh) names the workers; NCCL all-reduce across every worker's GPUs
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=BYTES_PER_PACK, implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
'''
    return '''

def make_strategy():
    """The chief builds the strategy; worker and PS tasks run a server and wait."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
        server.join()
        return None
    partitioner = (tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=256 << 10,
                                                                            max_shards=NUM_PS)
                   if PS_PARTITION == "even" else None)
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
'''


def render_tensorflow(spec: LaunchSpec) -> Rendered:
    s = spec.strategy
    cls = strategy_class(spec)
    ps = (spec.parameter_servers or ParameterServers()) if cls == "ParameterServerStrategy" else None
    if s.dp_impl == "parameter-server" and s.dp > spec.gpus_per_node and s.dp % spec.gpus_per_node:
        raise InputError("export", "tensorflow", f"parameter-server workers are whole nodes: dp={s.dp} is not a "
                         f"multiple of {spec.gpus_per_node} GPUs per node")
    if ps is not None and ps.placement == "colocated" and ps.num_ps is not None and ps.num_ps > spec.num_nodes:
        raise InputError("num-ps", ps.num_ps, f"colocated PS tasks run one per worker node ({spec.num_nodes})")
    warn = []
    imports = ["import json", "import os", "", "import keras", "import tensorflow as tf"]
    if cls == "ParameterServerStrategy":
        imports.append("from tensorflow.python.distribute import distribute_utils  # variable-read caching")
    run = "python3 train_keras.py" if cls == "MirroredStrategy" else "TASK=worker-0 ./launch_tf.sh"
    header = (f'"""Keras training skeleton for {spec.model.name} on {spec.num_gpus} GPUs ({spec.num_nodes} '
              f"node{'s' if spec.num_nodes > 1 else ''}), written by `planner recommend --export tensorflow`.\n\n"
              f"Plan: {s.to_string()}\nStrategy: tf.distribute.{cls} (profile {profile_for(spec)}, "
              f"catalogs/frameworks.yaml)\nRun: {run}\n"
              "Replace make_dataset() (or set DATA_FILES) with your data and the MODEL code with your model.\n"
              '"""\n')
    body = "\n".join(_constants(spec, ps))
    script = (header + "\n" + "\n".join(imports) + "\n\n" + body + "\n\n"
              + "keras.mixed_precision.set_global_policy(MIXED_PRECISION_POLICY)\n"
              + _MODEL_CODE + _strategy_code(spec)
              + (_PS_MAIN if cls == "ParameterServerStrategy" else _SYNC_MAIN))
    files = {"train_keras.py": script}
    if cls != "MirroredStrategy":
        configs = tf_configs(spec, (ps.num_ps or spec.num_nodes) if ps is not None else 0)
        files["tf_configs.json"] = json.dumps(configs, indent=2) + "\n"
        files["launch_tf.sh"] = _launcher(spec, sorted(configs))
        warn.append(f"tf_configs.json names hosts {spec.job_name}-<type>-<index>:{PORT} (Kubeflow TFJob service "
                    "names): replace them with your machines'")
    if s.precision == "fp16":
        warn.append("mixed_float16: Keras wraps the optimizer in a LossScaleOptimizer (dynamic loss scaling)")
    return Rendered(files=files, warnings=warn)


def _launcher(spec: LaunchSpec, tasks: list[str]) -> str:
    return (f"#!/usr/bin/env bash\n"
            f"# One TensorFlow task of {spec.model.name} on {spec.num_gpus} GPUs: TASK is one of the keys of "
            "tf_configs.json\n"
            f"# ({', '.join(tasks[:6])}{', ...' if len(tasks) > 6 else ''}); start every task, one per machine.\n"
            "set -euo pipefail\n"
            'cd "$(dirname "$0")"\n'
            ': "${TASK:?set TASK, e.g. TASK=worker-0}"\n'
            "export TF_CONFIG=\"$(python3 -c 'import json, sys; print(json.dumps(json.load(open(\"tf_configs.json\"))"
            "[sys.argv[1]]))' \"$TASK\")\"\n"
            f"exec python3 train_keras.py \"$@\"\n")
