"""User models (``file.py:callable``) for runtime tests that need no randomness in forward."""

from __future__ import annotations

from dl_nfv.profilers.zoo import text


def gpt2_tiny_without_dropout():
    """The zoo's gpt2-tiny architecture (tied head) with dropout off, so runs are comparable."""
    return text.GPT2(text.GPT2Config(vocab=96, d_model=32, layers=2, heads=2, max_positions=64,
                                     dropout=0.0))


def batches_failing_on_rank1(batch_size: int, seed: int):
    """A ``--data`` factory: good batches of mlp-tiny's shape, but rank 1 fails on its third."""
    import os

    import torch

    gen = torch.Generator().manual_seed(seed)
    for i in range(1_000_000):
        if i == 2 and os.environ.get("RANK") == "1":
            raise ValueError(f"corrupt batch {i}")
        yield torch.randn(batch_size, 1, 8, 8, generator=gen), torch.randint(0, 10, (batch_size,),
                                                                             generator=gen)
