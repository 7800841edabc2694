"""Configuration of WeDLM checkpoints (model_type "wedlm").

A WeDLM checkpoint is a Qwen2.5- or Qwen3-layout causal LM; the config is Qwen3's plus two fields:
``qk_norm`` (Qwen3 layers when true, Qwen2 layers with q/k/v bias when false) and ``mask_token_id``.
"""

from huggingface_hub.dataclasses import strict
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

from ..generation.transformers_version import check_transformers_version

check_transformers_version()  # before the class: transformers 4.x fails on its definition with a cryptic error


@strict
class WeDLMConfig(Qwen3Config):
    r"""
    qk_norm (`bool`, *optional*, defaults to `True`):
        RMS-normalise queries and keys per head (Qwen3 layers). When `False` the Qwen2 attention with q/k/v
        bias is used, as in WeDLM-7B.
    mask_token_id (`int`, *optional*):
        Id of the `[MASK]` token whose logits at logical position p predict the token at p.
    """

    model_type = "wedlm"

    qk_norm: bool = True
    mask_token_id: int | None = None


__all__ = ["WeDLMConfig"]
