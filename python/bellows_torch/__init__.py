# SPDX-License-Identifier: Apache-2.0
"""bellows' gradient compressors and the Accordion policy as a DDP communication hook.

    import bellows_torch
    state = bellows_torch.State("powersgd", low=4, high=1, accordion=True)
    model.register_comm_hook(state, bellows_torch.hook)
    ...
    state.end_epoch(lr)          # once per epoch, with the next epoch's learning rate

The hook is synchronous: it compresses, exchanges (through the process group's own collective)
and averages the bucket before it returns, and hands DDP a future that is already complete.
CPU tensors only (gloo); the bucket's gradients are averaged in place, layer by layer, through
views into the bucket, so nothing is copied beyond what each compressor needs.
"""
import torch
import torch.distributed as dist

from . import _C

__all__ = ["State", "hook", "config", "reference", "FAMILIES"]

FAMILIES = ("identity", "topk", "randk", "powersgd", "qsgd")


def config(compressor="powersgd", low=4, high=None, accordion=False, eta=0.5, interval=10,
           error_feedback="default", seed=0, threads=1, min_compression_rate=2.0, warm_start=True):
    """The configuration of a State (see State for the meaning of each argument)."""
    if compressor not in FAMILIES:
        raise ValueError(f"bellows_torch: compressor must be one of {FAMILIES}, got {compressor!r}")
    cfg = _C.Config()
    cfg.family = compressor
    cfg.low = float(low)
    cfg.high = float(low if high is None else high)
    cfg.accordion = bool(accordion)
    cfg.eta = float(eta)
    cfg.interval = int(interval)
    cfg.feedback = error_feedback
    cfg.seed = int(seed)
    cfg.threads = int(threads)
    cfg.min_compression_rate = float(min_compression_rate)
    cfg.warm_start = bool(warm_start)
    return cfg


class State:
    """What the hook keeps between steps: one bellows Synchronizer per DDP bucket.

    compressor: "identity", "topk", "randk", "powersgd" or "qsgd".
    low: the level in critical regimes (the less compressed one): PowerSGD's rank, top-k's or
        rand-k's ratio in (0, 1], QSGD's bits (2, 4, 8). Without Accordion it is used always.
    high: the level elsewhere (Accordion only; a higher rank is the low level: rank 4 low, 1 high).
    accordion: switch each layer between the levels by Accordion's gradient-norm rule, checked
        at the end of every `interval`-th epoch with threshold `eta` (call end_epoch).
    error_feedback: "default" (each compressor's own: on for top-k, rand-k, PowerSGD; off for
        QSGD), "residual" or "none".
    seed: key of the random streams (PowerSGD's query, rand-k's indices, QSGD's rounding); the
        same on every rank.
    threads: threads of the CPU executor bellows' kernels use in each process.
    min_compression_rate, warm_start: PowerSGD's, as in PyTorch's PowerSGDState.
    process_group: the group to average over (default: the default group).
    """

    def __init__(self, compressor="powersgd", *, process_group=None, **options):
        self.config = config(compressor, **options)
        group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
        self.process_group = group
        self._state = _C.HookState(self.config, group)
        self.non_finite_steps = 0

    def end_epoch(self, lr):
        """Ends the epoch on every bucket (call it on every rank): `lr` is the learning rate of the
        epoch that starts next. Accordion decides the levels of the next epochs here."""
        self._state.end_epoch(float(lr))

    def telemetry(self):
        """{bucket index: [per-layer dicts: name, compressed, level, steps, skipped, bytes, floats]}"""
        return self._state.telemetry()

    def floats_sent(self):
        """Values this rank has handed to the collective so far, over all buckets and steps."""
        return sum(layer["floats"] for layers in self.telemetry().values() for layer in layers)

    def prepare(self, bucket):
        """Makes the synchronizer of a bucket as the hook would, without a step (so that query()
        shows the initial query)."""
        self._state.prepare(bucket.index(), bucket.buffer(), bucket.gradients())

    def query(self, bucket_index, layer):
        """PowerSGD's query of one layer of a bucket, as a (rank, m) tensor (row j: column j of Q)."""
        return self._state.query(bucket_index, layer)

    def rebuilds(self):
        """How often a bucket was seen with other parameters than before (DDP rebuilds its buckets
        once after the first iteration); each time that bucket's state starts over."""
        return self._state.rebuilds()


def hook(state, bucket):
    """The communication hook: register with model.register_comm_hook(state, hook)."""
    buffer = bucket.buffer()
    statuses = state._state.run(bucket.index(), buffer, bucket.gradients())
    if any(statuses):
        # Every rank found a non-finite gradient in the same layer and left the bucket as it was;
        # the trainer should skip this step (as a mixed-precision scaler would).
        state.non_finite_steps += 1
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def reference(cfg, bucket_index, shapes, inputs, end_epoch_lr=()):
    """bellows called directly on bellows' own threads collective: inputs[r][s] is rank r's flat
    bucket at step s (the gradients of `shapes` one after the other); returns the averaged
    buckets. end_epoch_lr[s] > 0 ends an epoch after step s with that learning rate. cfg: a
    State or config(...)."""
    cfg = cfg.config if isinstance(cfg, State) else cfg
    return _C.reference(cfg, int(bucket_index), [list(s) for s in shapes],
                        [list(steps) for steps in inputs], [float(v) for v in end_epoch_lr])
