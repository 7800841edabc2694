"""Which models WeDLM decoding can drive, and why the others cannot."""

import inspect

from transformers import PreTrainedModel

SUPPORTED_MODEL_TYPES = ("wedlm", "llama", "mistral", "qwen2", "qwen3")
"""Decoder-only RoPE models whose forward takes explicit `position_ids`: the window's logical positions."""


def check_supported(model: PreTrainedModel) -> None:
    """Raise a ValueError naming the supported architectures if `model` cannot run WeDLM decoding."""
    model_type = getattr(model.config, "model_type", None)
    takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    if model_type not in SUPPORTED_MODEL_TYPES or not takes_positions or model.config.is_encoder_decoder:
        raise ValueError(
            f"WeDLM decoding needs a decoder-only model with rotary position ids; model_type {model_type!r} is not "
            f"supported. Supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    sliding_window = getattr(model.config, "sliding_window", None)
    if sliding_window is not None and getattr(model.config, "use_sliding_window", True):
        raise ValueError(
            f"WeDLM decoding does not support sliding-window attention (config.sliding_window={sliding_window}): "
            "cached windows are reordered, so physical distance is not logical distance. Set "
            "`model.config.sliding_window = None` if your contexts fit in full attention."
        )
