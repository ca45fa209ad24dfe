"""The learning-rate schedule: linear warm-up, then a cosine decay to a floor."""

import math


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based).

    Warm-up: rises linearly from 0 at step 0 to 1 at `warmup_steps`. Then follows half a cosine
    from 1 down to `min_lr_ratio` at `total_steps`, and stays there.
    """
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must lie in [0, 1], got {min_lr_ratio}")
    if warmup_steps < 0 or total_steps < warmup_steps:
        raise ValueError("need 0 <= warmup_steps <= total_steps")
    # BEGIN SOLUTION
    # Adam's moment estimates are poor for the first steps; a small learning rate while they
    # settle keeps an early huge update from wrecking the random initialisation.
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * cosine
    # END SOLUTION
