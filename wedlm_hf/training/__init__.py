"""Training the embedded WeDLM checkpoint: dual-stream objective, tokenizer, corpus, and the recipe that
`wedlm-hf train` runs."""

from .objective import (
    DualStreamCollator,
    WeDLMTrainer,
    dual_stream_attention_mask,
    dual_stream_forward,
    dual_stream_loss,
    dual_stream_visibility,
)
from .tokenizer import EOS_TOKEN, MASK_TOKEN, PAD_TOKEN, train_tokenizer

__all__ = [
    "DualStreamCollator",
    "EOS_TOKEN",
    "MASK_TOKEN",
    "PAD_TOKEN",
    "WeDLMTrainer",
    "dual_stream_attention_mask",
    "dual_stream_forward",
    "dual_stream_loss",
    "dual_stream_visibility",
    "train_tokenizer",
]
