"""The resumable sampler: order is a pure function of the position; every world size reads the same batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from growlm.data.sampler import ResumableSampler, TokenWindows, micro_batch_start


def test_each_epoch_is_a_permutation_and_epochs_differ():
    s = ResumableSampler(50, seed=3)
    e0, e1 = s.sample_ids(0, 50), s.sample_ids(50, 50)
    assert sorted(e0.tolist()) == list(range(50)) and sorted(e1.tolist()) == list(range(50))
    assert not torch.equal(e0, e1)


def test_order_depends_only_on_position_and_seed():
    a, b = ResumableSampler(37, seed=1), ResumableSampler(37, seed=1)
    whole = a.sample_ids(0, 100)
    pieces = torch.cat([b.sample_ids(i, 10) for i in range(0, 100, 10)])
    assert torch.equal(whole, pieces)  # a resumed reader continues exactly
    assert not torch.equal(whole, ResumableSampler(37, seed=2).sample_ids(0, 100))


@pytest.mark.parametrize("world, micro, gas", [(1, 8, 1), (2, 4, 1), (4, 1, 2), (2, 2, 2)])
def test_global_batch_is_the_same_at_any_world_size(world, micro, gas):
    s = ResumableSampler(1000, seed=0)
    consumed = 16 * 5  # after 5 steps of a global batch of 16
    ids = [
        s.sample_ids(micro_batch_start(consumed, micro, j, r, world), micro) for j in range(gas) for r in range(world)
    ]
    assert torch.equal(torch.cat(ids), s.sample_ids(consumed, micro * gas * world))


def test_token_windows_inputs_and_shifted_targets():
    tokens = np.arange(100, dtype=np.uint16)
    w = TokenWindows(tokens, seq_len=8)
    assert len(w) == (100 - 1) // 8
    x, y = w.batch(torch.tensor([0, 3]))
    assert x.dtype == torch.int64 and x.shape == (2, 8)
    assert x[1].tolist() == list(range(24, 32)) and y[1].tolist() == list(range(25, 33))


def test_too_little_data_is_refused():
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TokenWindows(np.arange(8, dtype=np.uint16), seq_len=8)
    with pytest.raises(ValueError, match="no full sample"):
        ResumableSampler(0, seed=0)
