"""The WeDLM model family (model_type "wedlm") built on transformers' Qwen2/Qwen3 layers."""

from .configuration_wedlm import WeDLMConfig
from .modeling_wedlm import WeDLMForCausalLM, WeDLMModel, WeDLMPreTrainedModel

__all__ = ["WeDLMConfig", "WeDLMForCausalLM", "WeDLMModel", "WeDLMPreTrainedModel"]
