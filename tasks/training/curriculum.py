"""Curriculum sampling: rows drawn in proportion to their stored weights, on a schedule that
starts with the easiest difficulty and widens to the full mix."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import torch


def curriculum_order(weights: Sequence[float], levels: Sequence[int], num_samples: int, seed: int = 0,
                     warmup_fraction: float = 0.5) -> list[int]:
    """Indices to visit. At progress p the levels allowed rise linearly from the easiest to all
    of them over the first `warmup_fraction` of the run (easy → mixed); within what is allowed,
    each index is drawn with probability proportional to its weight."""
    if len(weights) != len(levels) or not weights:
        raise ValueError("need one weight and one level per row, and at least one row")
    rng = random.Random(seed)
    lo, hi = min(levels), max(levels)
    order = []
    for i in range(num_samples):
        progress = i / max(1, num_samples)
        ceiling = hi if warmup_fraction <= 0 else lo + (hi - lo) * min(1.0, progress / warmup_fraction)
        allowed = [j for j, level in enumerate(levels) if level <= ceiling + 1e-9 and weights[j] > 0]
        if not allowed:
            allowed = [j for j in range(len(levels)) if weights[j] > 0] or list(range(len(levels)))
        order.append(rng.choices(allowed, weights=[max(weights[j], 1e-12) for j in allowed])[0])
    return order


class CurriculumSampler(torch.utils.data.Sampler):
    def __init__(self, weights: Sequence[float], levels: Sequence[int], num_samples: int, seed: int = 0,
                 warmup_fraction: float = 0.5):
        self.order = curriculum_order(weights, levels, num_samples, seed, warmup_fraction)

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class CurriculumMixin:
    """For a transformers Trainer subclass: use `self.curriculum_sampler` when set."""

    curriculum_sampler: CurriculumSampler | None = None

    def _get_train_sampler(self, train_dataset=None):
        if self.curriculum_sampler is not None:
            return self.curriculum_sampler
        return super()._get_train_sampler(train_dataset)
