"""Draft-only adapters: LoRA that acts at mask slots alone, so lossless WeDLM decoding returns the base model's own
greedy output while the adapter proposes the drafts (docs/finetune.md). Importing this package needs no PEFT; gating
a model does."""

from .attach import gate_draft_only_adapters
from .config import (
    MERGE_REFUSED,
    draft_only_defaults,
    draft_only_lora_config,
    draft_only_mask_id,
    linear_module_names,
    record_decoding_defaults,
    unwrapped,
)

__all__ = [
    "MERGE_REFUSED",
    "draft_only_defaults",
    "draft_only_lora_config",
    "draft_only_mask_id",
    "gate_draft_only_adapters",
    "linear_module_names",
    "record_decoding_defaults",
    "unwrapped",
]
