"""Adapting causal LMs to WeDLM decoding: data, mask token and the `Trainer` recipe (`wedlm-hf finetune`)."""

from .recipe import FinetuneOptions, finetune

__all__ = ["FinetuneOptions", "finetune"]
