"""WeDLM model: transformers' own Qwen2/Qwen3 layers under model_type "wedlm", with WeDLM decoding in `generate`.

Nothing of the transformer is re-implemented. The only modelling change is *permutation awareness*: WeDLM feeds
tokens in a physical order that differs from their RoPE (logical) order, and transformers reads non-monotonic
`position_ids` without a mask or cache as packed sequences. `WeDLMModel.forward` therefore always hands the mask
builders an explicit mask (and FlashAttention explicit sequence lengths), so reordered windows stay one sequence.
"""

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2DecoderLayer
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3Attention,
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from .configuration_wedlm import WeDLMConfig
from ..generation.attention import explicit_attention_kwargs
from ..generation.mixin import WeDLMGenerationMixin


class WeDLMPreTrainedModel(Qwen3PreTrainedModel):
    config_class = WeDLMConfig
    config: WeDLMConfig
    _no_split_modules = ["Qwen2DecoderLayer", "Qwen3DecoderLayer"]
    _can_record_outputs = {
        "hidden_states": [Qwen2DecoderLayer, Qwen3DecoderLayer],
        "attentions": [Qwen2Attention, Qwen3Attention],
    }


class WeDLMModel(WeDLMPreTrainedModel, Qwen3Model):
    """Qwen3 decoder stack, or Qwen2 layers (q/k/v bias, no q/k norm) when `config.qk_norm` is false."""

    def __init__(self, config: WeDLMConfig):
        WeDLMPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        decoder_layer = Qwen3DecoderLayer if config.qk_norm else Qwen2DecoderLayer
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([decoder_layer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.has_sliding_layers = "sliding_attention" in config.layer_types
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ):
        if position_ids is not None and attention_mask is None:
            reference = input_ids if input_ids is not None else inputs_embeds
            past_length = cache.get_seq_length() if cache is not None else 0
            attention_mask, extra = explicit_attention_kwargs(
                self.config, reference.shape[0], reference.shape[1], past_length, reference.device
            )
            kwargs = {**extra, **kwargs}
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )


class WeDLMForCausalLM(WeDLMGenerationMixin, WeDLMPreTrainedModel, Qwen3ForCausalLM):
    """Causal LM with WeDLM parallel decoding available as `generate(..., decoding="wedlm")`."""

    def __init__(self, config: WeDLMConfig):
        WeDLMPreTrainedModel.__init__(self, config)
        self.model = WeDLMModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


__all__ = ["WeDLMPreTrainedModel", "WeDLMModel", "WeDLMForCausalLM"]
