"""WeDLM model: transformers' own Qwen2/Qwen3 layers under model_type "wedlm", with WeDLM decoding in `generate`.

Nothing of the transformer is re-implemented, its forward included: WeDLM feeds tokens in a physical order that
differs from their RoPE (logical) order, and transformers reads non-monotonic `position_ids` without a mask or
cache as packed sequences, but the decoding loop never makes such a call (every forward carries its cache, and
FlashAttention explicit sequence lengths; generation/attention.py). A call without mask or cache therefore means
what it means for Qwen3: padding-free packed rows (`DataCollatorWithFlattening`) stay separate sequences.
"""

from torch import nn
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


class WeDLMForCausalLM(WeDLMGenerationMixin, WeDLMPreTrainedModel, Qwen3ForCausalLM):
    """Causal LM with WeDLM parallel decoding available as `generate(..., decoding="wedlm")`."""

    def __init__(self, config: WeDLMConfig):
        WeDLMPreTrainedModel.__init__(self, config)
        self.model = WeDLMModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


__all__ = ["WeDLMPreTrainedModel", "WeDLMModel", "WeDLMForCausalLM"]
