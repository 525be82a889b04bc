# SPDX-License-Identifier: Apache-2.0
"""bellows' gradient compressors and the Accordion policy as a DDP communication hook.

    import bellows_torch
    state = bellows_torch.State("powersgd", low=4, high=1, accordion=True, model=model)
    model.register_comm_hook(state, bellows_torch.hook)
    ...
    state.end_epoch(lr)          # once per epoch, with the next epoch's learning rate
    torch.save(state.state_dict(), path)           # and state.load_state_dict(torch.load(path))

The state keeps one bellows synchronizer for the model's parameters, each keyed by its name, so
that a parameter's error memory, query and random numbers follow it into whatever bucket DDP
puts it in; each DDP bucket is exchanged in one process-group call per round and operation. With
overlap=True (the default) the hook hands the bucket to the State's worker thread and returns
a future that thread completes: DDP goes on with the backward pass while the bucket is
compressed and exchanged. CPU tensors (gloo); float32, bfloat16 and float16 buckets (the
compressors work in float32, the error memory stays float32). At interpreter exit, every
State's worker first finishes the buckets handed to it (see _close_workers).
"""
import atexit
import queue
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import _C

__all__ = ["State", "hook", "config", "reference", "FAMILIES", "default_level"]

# The compressors of bellows/compressors/list.hpp, by name.
FAMILIES = tuple(_C.families())


# States whose worker thread runs. The worker is a daemon thread, and Python stops a daemon thread
# that takes the GIL once the interpreter is finalizing: inside a C++ frame (the extension's, or
# torch's Future.set_result, which releases the GIL around its callbacks) that aborts the process
# ("terminate called without an active exception"). So the workers are closed at exit, before
# finalization, as a trainer that returns right after its last future would otherwise race.
_with_worker = set()


@atexit.register
def _close_workers():
    for state in list(_with_worker):
        state.close()


def default_level(compressor):
    """The library's default of the option a level of `compressor` sets (0 for identity)."""
    return _C.default_level(compressor)
# What state_dict() records of the configuration and load_state_dict() requires to match (not
# `threads`: the executor's threads change no result).
CONFIG_FIELDS = ("family", "low", "high", "accordion", "eta", "interval", "feedback", "seed",
                 "min_compression_rate", "warm_start", "level_change", "exchange", "owner_memory")
# Fields added after the first format, with the value a dict that lacks them was saved with.
FIELD_DEFAULTS = {"level_change": repr("keep"), "exchange": repr("gather"), "owner_memory": repr("default")}
FORMAT = "bellows_torch.State/3"  # 3: one synchronizer for the model; 2: one per parameter, with the rank
EARLIER_FORMATS = ("bellows_torch.State/1", "bellows_torch.State/2")


def config(compressor="powersgd", low=4, high=None, accordion=False, eta=0.5, interval=10,
           error_feedback="default", seed=0, threads=1, min_compression_rate=2.0, warm_start=True,
           level_change="keep", exchange="gather", owner_memory="default"):
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
    if level_change not in ("keep", "reset"):
        raise ValueError(f"bellows_torch: level_change must be 'keep' or 'reset', got {level_change!r}")
    cfg.level_change = level_change
    if exchange not in ("gather", "scatter", "leader"):
        raise ValueError(f"bellows_torch: exchange must be 'gather', 'scatter' or 'leader', got {exchange!r}")
    cfg.exchange = exchange
    if owner_memory not in ("default", "on", "off"):
        raise ValueError(f"bellows_torch: owner_memory must be 'default', 'on' or 'off', got {owner_memory!r}")
    cfg.owner_memory = owner_memory
    return cfg


def _config_values(cfg):
    # As repr strings: PyTorch 1.13's weights_only loader reads no pickled float (opcode BINFLOAT),
    # and repr round-trips a float exactly.
    return {field: repr(getattr(cfg, field)) for field in CONFIG_FIELDS}


def _shown(value):
    """A saved configuration value (a repr string) as a user wrote it: a whole float as an integer
    (a rank of 4 is stored as '4.0')."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return value
    return str(int(x)) if x.is_integer() else value


class State:
    """What the hook keeps between steps: one bellows synchronizer of the model's parameters (or,
    without a model, one per DDP bucket).

    compressor: one of FAMILIES ("identity", "topk", "randk", "powersgd", "qsgd", ...).
    low: the level in critical regimes (the less compressed one): the option the compressor's
        descriptor names as its level (docs/compressors.md#the-list): PowerSGD's rank, top-k's or
        rand-k's ratio in (0, 1], QSGD's bits (2, 4, 8). Without Accordion it is used always.
    high: the level elsewhere (Accordion only; a higher rank is the low level: rank 4 low, 1 high).
    accordion: switch each layer between the levels by Accordion's gradient-norm rule, checked
        at the end of every `interval`-th epoch with threshold `eta` (call end_epoch).
    error_feedback: "default" (each compressor's own: on for top-k, rand-k, PowerSGD; off for
        QSGD), "residual" or "none".
    seed: key of the random streams (PowerSGD's query, rand-k's indices, QSGD's rounding); the
        same on every rank. Each parameter's streams are keyed by the seed and its name.
    threads: threads of the CPU executor bellows' kernels use in each process.
    min_compression_rate, warm_start: PowerSGD's, as in PyTorch's PowerSGDState.
    level_change: "keep" (default): a layer that Accordion switches keeps its error memory (and
        PowerSGD's shared query columns); "reset": it starts the new level afresh (memory zero,
        PowerSGD's query drawn anew), as docs/synchronizer.md describes.
    exchange: "gather" (default): each rank's payload goes to every rank; "leader" (top-k only):
        the indices of one rank, taking turns by step, are every rank's, and only the values at
        them are summed, so each rank receives about 2 k indices and values whatever the world
        size (docs/spec.md#top-k-leader); "scatter" (QSGD, EF-signSGD, top-k, per-rank rand-k):
        each parameter cut into one chunk per rank, averaged and re-encoded by the rank that owns
        it, then gathered, so each rank receives about two payloads' worth whatever the world size
        (docs/spec.md#scatter-exchange).
    owner_memory: under scatter, whether a chunk's owner keeps the error of its re-encoding:
        "default" (the compressor's: off for QSGD, on for EF-signSGD, top-k and rand-k), "on" or "off".
    model: the module (or its DDP wrapper) whose gradients the hook averages. The state is then
        keyed by parameter name and made up front, which state_dict() needs. Without it, a
        gradient is known by its bucket and position ("bucket3.grad1"), and a parameter that DDP
        moves to another bucket or position starts over.
    overlap: True: the hook returns at once and the State's worker thread averages the bucket
        and completes the future; False: the hook averages before it returns.
    process_group: the group to average over. Default: with overlap, a group of the default
        group's ranks made for this State (dist.new_group, so every rank must make its States in
        the same order), so that the worker's exchanges never interleave with anything else;
        without overlap, the default group.
    """

    def __init__(self, compressor="powersgd", *, process_group=None, model=None, overlap=True, **options):
        self.config = config(compressor, **options)
        if process_group is None:
            process_group = dist.new_group() if overlap else dist.distributed_c10d._get_default_group()
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self._state = _C.HookState(self.config, process_group)
        self.non_finite_steps = 0
        self.overlap = bool(overlap)
        self._names = None
        if model is not None:
            if isinstance(model, DistributedDataParallel):
                model = model.module
            self._names, self._shapes = {}, {}
            for name, p in model.named_parameters():
                if p.requires_grad:
                    self._names[p.data_ptr()] = name
                    self._shapes[name] = list(p.shape)
            self._state.prepare("", list(self._shapes), list(self._shapes.values()))
        self._queue = queue.Queue()
        self._worker = None
        self._error = None

    def names(self, bucket):
        """The keys of a bucket's gradients: parameter names with a model, else bucket positions."""
        if self._names is None:
            return [f"bucket{bucket.index()}.grad{j}" for j in range(len(bucket.gradients()))]
        try:
            return [self._names[p.data_ptr()] for p in bucket.parameters()]
        except KeyError:
            raise ValueError("bellows_torch: the bucket holds a parameter that is not one of the State's "
                             "model's (was State(model=...) given the module DDP wraps?)") from None

    def _group(self, bucket):
        """The synchronizer a bucket goes to: the model's (""), or without a model the bucket's own."""
        return "" if self._names is not None else f"bucket{bucket.index()}"

    def _average(self, group, names, bucket_buffer, grads, fut):
        try:
            if any(self._state.run(group, names, grads)):
                # Every rank found a non-finite gradient in the same parameter and left it as it
                # was; the trainer should skip this step (as a mixed-precision scaler would).
                self.non_finite_steps += 1
        except Exception as e:  # handed to whoever waits on the future (DDP re-raises it)
            fut.set_exception(e)
            return
        fut.set_result(bucket_buffer)

    def _work(self):
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._average(*job)
            finally:
                self._queue.task_done()

    def submit(self, bucket):
        """Averages a bucket (in the worker with overlap, else now); returns its future."""
        fut = torch.futures.Future()
        job = (self._group(bucket), self.names(bucket), bucket.buffer(), bucket.gradients(), fut)
        if not self.overlap:
            self._average(*job)
            return fut
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="bellows_torch", daemon=True)
            self._worker.start()
            _with_worker.add(self)
        self._queue.put(job)
        return fut

    def wait(self):
        """Returns when the worker has averaged every bucket handed to it so far."""
        self._queue.join()

    def close(self):
        """Stops the worker thread (after the buckets in its queue); the hook restarts it."""
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None
            _with_worker.discard(self)

    def end_epoch(self, lr):
        """Ends the epoch on every parameter (call it on every rank): `lr` is the learning rate of
        the epoch that starts next. Accordion decides the levels of the next epochs here."""
        self.wait()
        self._state.end_epoch(float(lr))

    def telemetry(self):
        """{key: dict of compressed, level, steps, skipped, bytes, floats, norm} per parameter;
        norm: Accordion's mean-gradient norm of the parameter at its last check, averaged over the
        ranks (None before the first check, for an uncompressed parameter, and without Accordion)."""
        self.wait()
        return self._state.telemetry()

    def floats_sent(self):
        """Values this rank has handed to the collective so far, over all parameters and steps."""
        return sum(layer["floats"] for layer in self.telemetry().values())

    def prepare(self, bucket):
        """Makes the synchronizer of a bucket as the hook would, without a step (so that query()
        shows the initial query); with a model it was made with the State."""
        if self._names is None:
            self._state.prepare(self._group(bucket), self.names(bucket), [list(g.shape) for g in bucket.gradients()])

    def query(self, name):
        """PowerSGD's query of one parameter, as a (rank, m) tensor (row j: column j of Q)."""
        self.wait()
        return self._state.query(name)

    def rebuilds(self):
        """Without a model: how often a DDP bucket came with other gradients (names or shapes) than
        before, as after DDP's bucket rebuild; each time that bucket's state started over. With a
        model: 0 (the state is per parameter name, whatever the buckets)."""
        return self._state.rebuilds()

    def collective_calls(self):
        """Process-group calls this State has made so far (an allreduce counts one, an allgather
        two: the payload sizes, then the payloads), over all buckets, steps and epoch ends."""
        self.wait()
        return self._state.calls()

    def state_dict(self):
        """Everything the hook carries from step to step, for torch.save: the configuration, the
        rank and world size, the non-finite step count, the shape of every parameter by name (in
        the model's order), and one uint8 tensor, the synchronizer's checkpoint (compressor states,
        detector, counters, and the rank and parameters again). Each rank saves its own: an error
        memory belongs to one rank. Plain values and tensors only, so torch.load(...,
        weights_only=True) reads it."""
        if self._names is None:
            raise ValueError("bellows_torch: state_dict() needs State(..., model=module), to key the "
                             "state by parameter name")
        self.wait()
        names, shapes, data = self._state.state()
        return dict(format=FORMAT, config=_config_values(self.config), rank=self.rank, world_size=self.world_size,
                    non_finite_steps=self.non_finite_steps,
                    shapes={name: list(shape) for name, shape in zip(names, shapes)}, synchronizer=data)

    def load_state_dict(self, d):
        """Restores state_dict() output into this State (on every rank, its own rank's dict),
        before training resumes. Refuses (ValueError or RuntimeError, nothing changed) a dict of
        another compressor or levels, another rank or world size, or other parameters, and one of
        the formats before 3 (one synchronizer per parameter), which this version cannot read."""
        if self._names is None:
            raise ValueError("bellows_torch: load_state_dict() needs State(..., model=module)")
        if isinstance(d, dict) and d.get("format") in EARLIER_FORMATS:
            raise ValueError(f"bellows_torch: the saved state is of format {d['format']} (one synchronizer per "
                             f"parameter), which this version does not read: it keeps one synchronizer for the "
                             f"model (format {FORMAT}). Resume from the model and optimizer with a fresh State "
                             "(docs/pytorch.md#saving-and-resuming)")
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"bellows_torch: not a State.state_dict() of this version (format {FORMAT})")
        mine = _config_values(self.config)
        saved_config = {k: d["config"].get(k, FIELD_DEFAULTS.get(k)) for k in mine}
        differ = [f"{k}: saved {_shown(saved_config[k])}, this State {_shown(v)}" for k, v in mine.items()
                  if saved_config[k] != v]
        if differ:
            raise ValueError("bellows_torch: the saved state is of another configuration (" + "; ".join(differ) + ")")
        if d["world_size"] != self.world_size or d["rank"] != self.rank:
            raise ValueError(f"bellows_torch: the saved state is rank {d['rank']}'s of {d['world_size']} ranks, "
                             f"this process is rank {self.rank} of {self.world_size} (each rank loads its own)")
        expected = set(self._shapes)
        saved = set(d["shapes"])
        if saved != expected:
            raise ValueError("bellows_torch: the saved state is of other parameters (missing: "
                             f"{sorted(expected - saved)}, unknown: {sorted(saved - expected)})")
        reshaped = [f"{n}: saved {list(d['shapes'][n])}, the model's {s}" for n, s in self._shapes.items()
                    if list(d["shapes"][n]) != s]
        if reshaped:
            raise ValueError("bellows_torch: the saved state is of parameters of other shapes (" +
                             "; ".join(reshaped) + ")")
        self.wait()
        self._state.load(d["synchronizer"])
        self.non_finite_steps = int(d["non_finite_steps"])


def hook(state, bucket):
    """The communication hook: register with model.register_comm_hook(state, hook)."""
    return state.submit(bucket)


def reference(cfg, names, shapes, inputs, end_epoch_lr=()):
    """bellows called directly on bellows' own threads collective, one synchronizer per layer
    names[j] of shape shapes[j]: inputs[r][s] is rank r's gradients at step s (the layers one after
    the other); returns the averaged gradients in float32. end_epoch_lr[s] > 0 ends an epoch after
    step s with that learning rate. cfg: a State or config(...)."""
    cfg = cfg.config if isinstance(cfg, State) else cfg
    return _C.reference(cfg, list(names), [list(s) for s in shapes],
                        [list(steps) for steps in inputs], [float(v) for v in end_epoch_lr])
