"""Configuration of WeDLM checkpoints (model_type "wedlm").

A WeDLM checkpoint is a Qwen2.5- or Qwen3-layout causal LM; the config is Qwen3's plus `qk_norm` and
`mask_token_id`. The layout follows the authors' engine, which reads only `attention_bias`: q/k/v bias without
q/k norm (Qwen2.5, WeDLM-7B) when it is true, q/k norm without bias (Qwen3, WeDLM-8B) when it is false. As in the
authors' config class, `head_dim` defaults to `hidden_size // num_attention_heads`; the tensor-parallel plan is
that of the layout's layers.
"""

from huggingface_hub.dataclasses import strict
from transformers.models.qwen2.configuration_qwen2 import Qwen2Config
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
from transformers.utils import logging

from .layout import QWEN_MASK_TOKEN_ID, apply_layout

logger = logging.get_logger(__name__)

from ..generation.transformers_version import check_transformers_version

check_transformers_version()  # before the class: transformers 4.x fails on its definition with a cryptic error


@strict
class WeDLMConfig(Qwen3Config):
    r"""
    attention_bias (`bool`, *optional*):
        q/k/v projections with bias and no q/k norm (Qwen2 layers) when `True`, q/k norm and no bias (Qwen3
        layers) when `False`. Defaults to `not qk_norm`, or to `True` when neither is given, as in the authors'
        config class.
    qk_norm (`bool`, *optional*):
        RMS-normalise queries and keys per head. Defaults to `not attention_bias`; giving both with
        `qk_norm == attention_bias` is an error, since no WeDLM checkpoint has that layout.
    head_dim (`int`, *optional*):
        Width of each attention head. Defaults to `hidden_size // num_attention_heads`, as in the authors' config
        class and Qwen2's layers (Qwen3's config would take 128, which fits only its own sizes).
    mask_token_id (`int`, *optional*):
        Id of the `[MASK]` token whose logits at logical position p predict the token at p. Defaults to 151665
        (with a log line) when `vocab_size` is a Qwen vocabulary's, otherwise stays unset.
    """

    model_type = "wedlm"
    has_no_defaults_at_init = True  # transformers 5.19 would otherwise build `WeDLMConfig()` (and log the mask-id
    # fallback meant for a real config) whenever it prints or saves one; 5.20 reads the fields' defaults instead

    head_dim: int | None = None
    attention_bias: bool | None = None
    qk_norm: bool | None = None
    mask_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if apply_layout(self):
            logger.warning_once(
                f"WeDLMConfig has no `mask_token_id`; using {QWEN_MASK_TOKEN_ID}, the mask id of the public WeDLM "
                "checkpoints, for this Qwen vocabulary."
            )
        # the tensor-parallel plan of the layers this layout builds (Qwen2's has no q/k norm entries), on the
        # instance: transformers 5.20 and older extend it there for tied embeddings (5.21 dropped that)
        self.base_model_tp_plan = Qwen3Config.base_model_tp_plan if self.qk_norm else Qwen2Config.base_model_tp_plan
        super().__post_init__(**kwargs)


__all__ = ["WeDLMConfig"]
