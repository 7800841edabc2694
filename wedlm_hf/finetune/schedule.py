"""How long a fine-tuning run trains and how its learning rate rises: a warm-up that fits the run, a time limit.

Both act on `Trainer`'s own machinery: the warm-up is `TrainingArguments.warmup_steps` (a step count, or a share of
`max_steps` below 1), read back with `TrainingArguments.get_warmup_steps` as `Trainer` reads it.
"""

import time

from transformers import TrainerCallback, TrainingArguments
from transformers.utils import logging

logger = logging.get_logger(__name__)


def fit_warmup(args: TrainingArguments) -> None:
    """Shorten a warm-up that would last the whole run, with one warning line, so the learning rate reaches its peak.

    `Trainer` logs the rate each step trained at, before the scheduler steps: step k of a W-step linear warm-up trains
    at (k - 1) / W of the peak, so the peak is reached at step W + 1, and W must be at most `max_steps` - 1 (a 10-step
    warm-up of a 3-step run would log 0, a tenth and a fifth of the peak and stop there).
    """
    warmup = args.get_warmup_steps(args.max_steps)
    if warmup < args.max_steps:
        return
    logger.warning(
        f"--warmup-steps {args.warmup_steps:g} is {warmup} warm-up steps, not shorter than the run's --max-steps "
        f"{args.max_steps}: the learning rate would never reach its peak, so the warm-up is {args.max_steps - 1} steps"
    )
    args.warmup_steps = args.max_steps - 1


class TimeLimit(TrainerCallback):
    """Stops training (with a final save) once `minutes` have passed: a fixed budget on a shared machine."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.started >= self.seconds:
            control.should_training_stop = True
            control.should_save = True
        return control
