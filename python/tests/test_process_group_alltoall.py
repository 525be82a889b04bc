# SPDX-License-Identifier: Apache-2.0
"""The hook's process-group adapter's alltoall (bellows::AlltoallCollective over c10d, gloo) on
2 processes: every rank receives, in rank order, the block each rank addressed to it, blocks of
any size, empty ones included, in two process-group calls."""
import unittest

import torch
import torch.distributed as dist

import dist_util


def _size(sender, to, round_):
    return (sender * 3 + to * 5 + round_) % 7


def _block(sender, to, round_):
    return torch.tensor([(sender * 61 + to * 17 + round_ * 5 + k) % 256 for k in range(_size(sender, to, round_))],
                        dtype=torch.uint8)


def _exchange(rank):
    from bellows_torch import _C
    group = dist.distributed_c10d._get_default_group()
    world = dist.get_world_size()
    results = []
    for round_ in range(7):  # every pair of sizes mod 7, each block empty in some round
        got, calls = _C.alltoall(group, [_block(rank, to, round_) for to in range(world)])
        want = [_block(sender, rank, round_) for sender in range(world)]
        results.append((len(got) == world and all(torch.equal(g, w) for g, w in zip(got, want)), calls))
    try:
        _C.alltoall(group, [torch.zeros(2, dtype=torch.float32)] * world)
        refused = ""
    except RuntimeError as err:
        refused = str(err)
    return dist_util.gather((results, refused))


class ProcessGroupAlltoall(unittest.TestCase):
    def test_every_rank_gets_the_blocks_addressed_to_it(self):
        for results, refused in dist_util.run(_exchange):
            self.assertEqual(results, [(True, 2)] * 7)
            self.assertIn("blocks of uint8", refused)


if __name__ == "__main__":
    unittest.main()
