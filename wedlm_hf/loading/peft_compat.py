"""PEFT against transformers 5.24: PEFT (0.21) still reads `model.is_gradient_checkpointing` when it wraps a model
(and calls `gradient_checkpointing_enable` when asked to), which transformers 5.24 deprecates with a
`FutureWarning` a user of `wedlm-hf` can do nothing about. Those two warnings, and only while PEFT runs, are
silenced here; any other warning still shows."""

import contextlib
import warnings
from collections.abc import Iterator

PEFT_DEPRECATIONS = (
    r"`is_gradient_checkpointing` is deprecated",
    r"`gradient_checkpointing_enable` is deprecated",
)


@contextlib.contextmanager
def peft_deprecations_silenced() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in PEFT_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        yield
