"""Training samples from a token file, in an order that a resumed run reproduces exactly.

A *sample* is a window of T + 1 consecutive tokens (inputs are the first T, targets the last T). Sample k of a
token file with N tokens starts at token k * T, so there are (N - 1) // T samples and no window overlaps another.
The training order is a sequence of epochs, each a permutation of all samples drawn from a generator seeded by
(seed, epoch). Global position p in that sequence is therefore a pure function of p: the only state a run
carries is the number of samples it has consumed.

A global batch of G = micro_batch_size * gradient_accumulation_steps * dp_world samples takes positions
[consumed, consumed + G): micro step j of data-parallel rank r reads positions
consumed + (j * dp_world + r) * micro_batch_size + [0, micro_batch_size). The same global batch is read at any
data-parallel world size with the same G, so a resume at another world size sees the same data.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import Tensor


class ResumableSampler:
    """Epoch-wise shuffled order of ``n_samples`` samples; position -> sample id is a pure function.

    Args:
        n_samples: number of samples in the token file (>= 1).
        seed: data-order seed; the permutation of epoch e uses seed * 1_000_003 + e.

    Raises:
        ValueError: n_samples < 1.
    """

    def __init__(self, n_samples: int, seed: int) -> None:
        if n_samples < 1:
            raise ValueError(
                f"n_samples={n_samples}: the token file holds no full sample; use more text or a shorter seq_len"
            )
        self.n_samples, self.seed = n_samples, seed
        self._perm = lru_cache(maxsize=2)(self._permutation)

    def _permutation(self, epoch: int) -> Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n_samples, generator=g)

    def sample_ids(self, start: int, count: int) -> Tensor:
        """Sample ids at global positions [start, start + count), shape (count,), int64."""
        out = torch.empty(count, dtype=torch.int64)
        for i, p in enumerate(range(start, start + count)):
            out[i] = self._perm(p // self.n_samples)[p % self.n_samples]
        return out


def micro_batch_start(
    consumed_samples: int, micro_batch_size: int, micro_step: int, dp_rank: int, dp_world: int
) -> int:
    """First global position read by micro step ``micro_step`` of data-parallel rank ``dp_rank`` (see module doc)."""
    return consumed_samples + (micro_step * dp_world + dp_rank) * micro_batch_size


class TokenWindows:
    """Samples of T + 1 tokens over a flat uint16 or uint32 token array (e.g. an ``np.memmap`` of ``train.bin``).

    Args:
        tokens: 1-D array of token ids, length N.
        seq_len: T, tokens per input sequence.

    Raises:
        ValueError: the array holds fewer than T + 1 tokens.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int) -> None:
        if len(tokens) < seq_len + 1:
            raise ValueError(
                f"the token file holds {len(tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
                "use more text or a shorter --seq_len"
            )
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def batch(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs and targets for sample ids (B,): two int64 tensors of shape (B, T)."""
        t = self.seq_len
        rows = np.stack([np.asarray(self.tokens[k * t : k * t + t + 1], dtype=np.int64) for k in ids.tolist()])
        rows = torch.from_numpy(rows)  # (B, T + 1)
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
