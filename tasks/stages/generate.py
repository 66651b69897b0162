"""Stage 1: generate task specs per family, seeded and reproducible."""

from __future__ import annotations

import random

from gymfoundry.envs.family import family as family_of
from gymfoundry.envs.records import LEVELS, TaskSpec


def family_env_class(family: str):
    return family_of(family).env


def generate_tasks(family: str, n: int, seed: int, levels: tuple[int, ...] = LEVELS) -> list[TaskSpec]:
    """`n` tasks of one family; the same (family, n, seed, levels) always gives the same tasks."""
    rng = random.Random(f"{family}:{seed}")
    env_class = family_env_class(family)
    return [env_class.generate_task(rng.randrange(2**31), levels[i % len(levels)]) for i in range(n)]
