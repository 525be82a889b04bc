# SPDX-License-Identifier: Apache-2.0
"""Every compressor through the DDP hook (2 gloo processes, a real DDP model with several buckets that
DDP rebuilds after the first iteration, SGD steps between) gives, parameter by parameter and step by
step, the same averaged gradients as bellows called directly (one synchronizer per parameter on its
own threads collective, no buckets) on the inputs the hook received: each parameter's state
follows it across the rebuild. The hook exchanges each DDP bucket in a few process-group calls.
Both sides run the same float arithmetic on the same inputs and gloo sums two ranks as a + b, as
bellows' local collective does, so the comparison is exact."""
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import bellows_torch
import dist_util

STEPS = 6
EPOCH_STEPS = 2        # end_epoch after every second step
LRS = (0.1, 0.1, 0.01)  # learning rate of epochs 1, 2, 3 (a decrease at the last boundary)

CONFIGS = {
    "identity": dict(compressor="identity"),
    "topk": dict(compressor="topk", low=0.1),
    "randk": dict(compressor="randk", low=0.2),
    "powersgd": dict(compressor="powersgd", low=2),
    "qsgd": dict(compressor="qsgd", low=4),
    "powersgd_accordion": dict(compressor="powersgd", low=4, high=1, accordion=True, interval=1),
    "topk_accordion": dict(compressor="topk", low=0.5, high=0.05, accordion=True, interval=1),
    "topk_leader_accordion": dict(compressor="topk", low=0.5, high=0.05, accordion=True, interval=1,
                                  exchange="leader"),
    "qsgd_scatter": dict(compressor="qsgd", low=4, exchange="scatter", owner_memory="on"),
    "signsgd_scatter_accordion": dict(compressor="signsgd", low=0, high=64, accordion=True, interval=1,
                                      exchange="scatter"),
    "topk_scatter_accordion": dict(compressor="topk", low=0.5, high=0.05, accordion=True, interval=1,
                                   exchange="scatter"),
}
# Every other compressor of the list, at the library's default level.
LISTED = [f for f in bellows_torch.FAMILIES if f not in CONFIGS]
CONFIGS.update({f: dict(compressor=f, low=bellows_torch.default_level(f)) for f in LISTED})


def model():
    torch.manual_seed(7)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 32),
                         nn.ReLU(), nn.Linear(32, 10))


def refusal(rank, options):
    """The message State(**options) raises."""
    try:
        bellows_torch.State(overlap=False, **options)
    except RuntimeError as e:
        return str(e)
    return None


def train(rank, name):
    recorder = dist_util.recorder()
    dist._DEFAULT_FIRST_BUCKET_BYTES = 4000  # DDP's first bucket, 1 MiB by default, held them all
    net = DDP(model(), bucket_cap_mb=0.004)  # about 1000 floats a bucket: the first iteration runs
    # one bucket of all six parameters, DDP's rebuild then makes two: every parameter changes place
    state = bellows_torch.State(seed=11, model=net, **CONFIGS[name])
    net.register_comm_hook(state, recorder)
    opt = torch.optim.SGD(net.parameters(), lr=LRS[0])
    gen = torch.Generator().manual_seed(100 + rank)
    calls = []  # process-group calls per step (the epoch ends' not counted)
    for step in range(STEPS):
        recorder.step = step
        x = torch.randn(16, 1, 8, 8, generator=gen)
        y = torch.randint(0, 10, (16,), generator=gen)
        opt.zero_grad()
        before = state.collective_calls()
        nn.functional.cross_entropy(net(x), y).backward()
        calls.append(state.collective_calls() - before)
        opt.step()
        if (step + 1) % EPOCH_STEPS == 0:
            lr = LRS[min((step + 1) // EPOCH_STEPS, len(LRS) - 1)]
            state.end_epoch(lr)
            recorder.events.append(("epoch", step, lr))
            for g in opt.param_groups:
                g["lr"] = lr
    shapes = {n: list(p.shape) for n, p in net.module.named_parameters()}
    return dist_util.gather(dict(events=recorder.events, shapes=shapes, calls=calls))


def without_model(rank):
    """The DDP run of train() with a State without a model: its synchronizers are DDP's buckets."""
    dist._DEFAULT_FIRST_BUCKET_BYTES = 4000
    net = DDP(model(), bucket_cap_mb=0.004)
    state = bellows_torch.State("powersgd", low=2, seed=11)
    net.register_comm_hook(state, bellows_torch.hook)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(3):
        x = torch.randn(16, 1, 8, 8, generator=gen)
        nn.functional.cross_entropy(net(x), torch.randint(0, 10, (16,), generator=gen)).backward()
    steps = {name: layer["steps"] for name, layer in state.telemetry().items()}
    return dist_util.gather(dict(rebuilds=state.rebuilds(), steps=steps))


class HookMatchesDirect(unittest.TestCase):
    """DDP with several buckets, rebuilt after the first iteration, against bellows with no
    buckets at all (one synchronizer per parameter, fed the same gradients)."""

    def check(self, name):
        per_rank = dist_util.run(train, name)
        shapes = per_rank[0]["shapes"]
        names = sorted(shapes)
        runs = [dist_util.per_step(r["events"]) for r in per_rank]
        buckets = runs[0][2]
        self.assertGreaterEqual(len(buckets[STEPS - 1]), 2, "the model should span several buckets")
        self.assertNotEqual(buckets[0], buckets[1], "DDP's rebuild should have changed the buckets")
        self.assertEqual(sorted(runs[0][0]), list(range(STEPS)))
        lrs = [runs[0][1].get(step, 0.0) for step in range(STEPS)]
        inputs = [[torch.cat([grads[step][n][0] for n in names]) for step in range(STEPS)] for grads, _, _ in runs]
        cfg = bellows_torch.config(seed=11, **CONFIGS[name])
        expected = bellows_torch.reference(cfg, names, [shapes[n] for n in names], inputs, lrs)
        for r, (grads, _, _) in enumerate(runs):
            for step in range(STEPS):
                got = torch.cat([grads[step][n][1] for n in names])
                want = expected[r][step]
                self.assertTrue(torch.equal(got, want), f"{name}: rank {r} step {step}: max difference "
                                f"{(got - want).abs().max().item()}")
        # One exchange per DDP bucket: per bucket and step at most 2 process-group calls (two
        # rounds, or top-k's dense switch beside an allgather of payloads of one size), one more
        # for the finiteness vote in the epochs Accordion observes, and 2 more in the first step
        # (the layer check). One synchronizer per parameter made 2 or 3 calls per parameter.
        vote = 1 if CONFIGS[name].get("accordion") else 0
        for step in range(STEPS):
            calls = per_rank[0]["calls"][step]
            most = (2 + vote) * len(buckets[step]) + (2 if step == 0 else 0)
            self.assertLessEqual(calls, most, f"{name}: step {step}: {calls} process-group calls for "
                                 f"{len(buckets[step])} buckets")
            self.assertEqual(calls, per_rank[1]["calls"][step])
        mean = (inputs[0][-1] + inputs[1][-1]) / 2
        if name == "identity":  # the reference itself: the plain mean over ranks
            self.assertTrue(torch.equal(expected[0][-1], mean))
        else:  # a compressor that changes nothing would pass the comparison: make sure it did
            self.assertFalse(torch.allclose(expected[0][-1], mean))

    def test_identity(self):
        self.check("identity")

    def test_topk(self):
        self.check("topk")

    def test_randk(self):
        self.check("randk")

    def test_powersgd(self):
        self.check("powersgd")

    def test_qsgd(self):
        self.check("qsgd")

    def test_powersgd_accordion(self):
        self.check("powersgd_accordion")

    def test_topk_accordion(self):
        self.check("topk_accordion")

    def test_topk_leader_accordion(self):
        self.check("topk_leader_accordion")

    def test_qsgd_scatter(self):
        self.check("qsgd_scatter")

    def test_signsgd_scatter_accordion(self):
        self.check("signsgd_scatter_accordion")

    def test_topk_scatter_accordion(self):
        self.check("topk_scatter_accordion")

    def test_every_other_listed_compressor(self):
        for name in LISTED:
            with self.subTest(name):
                self.check(name)

    def test_without_a_model_each_bucket_has_its_synchronizer(self):
        # DDP's rebuild after the first step turns its one bucket of six parameters into two:
        # bucket 0 comes with other gradients and starts over (one rebuild), bucket 1 is new.
        for r in dist_util.run(without_model):
            self.assertEqual(r["rebuilds"], 1)
            self.assertEqual(len(r["steps"]), 6)
            self.assertEqual(set(r["steps"].values()), {2}, r["steps"])
            self.assertEqual({name.split(".")[0] for name in r["steps"]}, {"bucket0", "bucket1"})

    def test_a_bad_level_is_refused_naming_the_argument(self):
        self.assertEqual(dist_util.run(refusal, dict(compressor="topk", low=1.5)),
                         "bellows_torch: low=1.5: topk: ratio must be in (0, 1], got 1.5")
        self.assertEqual(dist_util.run(refusal, dict(compressor="powersgd", low=4, high=0, accordion=True)),
                         "bellows_torch: high=0: powersgd: rank must be >= 1, got 0")
        self.assertEqual(dist_util.run(refusal, dict(compressor="powersgd", low=4, exchange="leader")),
                         "bellows_torch: exchange='leader': powersgd averages by its own exchange only "
                         "(exchange='gather')")
        self.assertEqual(dist_util.run(refusal, dict(compressor="qsgd", low=4, exchange="leader")),
                         "bellows_torch: exchange='leader': qsgd's exchanges are gather|scatter")
        self.assertEqual(dist_util.run(refusal, dict(compressor="powersgd", low=4, owner_memory="on")),
                         "bellows_torch: owner_memory='on': powersgd has no scatter exchange")


if __name__ == "__main__":
    unittest.main()
