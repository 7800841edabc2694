"""Which models WeDLM decoding can drive: a check of what it needs, not a list of names.

A WeDLM step feeds a window in a physical order that differs from its logical order and relies on three things:
every layer's attention sees every earlier token (so physical distance does not matter), every layer takes its
positions from `position_ids` through RoPE (so each slot gets its logical position), and the K/V of committed
tokens live in a transformers `Cache` that can be cropped and reordered. Each check below names the config
field or forward argument that breaks one of these.
"""

import inspect

from transformers import PreTrainedConfig, PreTrainedModel

from .transformers_version import CACHE_KEYWORD

WEDLM = "wedlm"

FORWARD_ARGUMENTS = ("position_ids", CACHE_KEYWORD, "logits_to_keep")
"""Arguments the decoding loop passes to the model's forward."""


def _decoder_problem(model: PreTrainedModel) -> str | None:
    if model.config.is_encoder_decoder:
        return "it is an encoder-decoder model; WeDLM decodes with a decoder-only causal LM"
    if not model.can_generate():
        return "it has no language-modelling head to generate with"
    return None


def _position_problem(model: PreTrainedModel, config: PreTrainedConfig) -> str | None:
    position_type = getattr(config, "position_embedding_type", "rope")
    alibi = getattr(config, "alibi", False) or getattr(getattr(config, "attn_config", None), "alibi", False)
    if alibi or position_type == "alibi":
        return "it uses ALiBi position biases, which follow the physical order, not RoPE from `position_ids`"
    if position_type not in ("rope", "rotary"):
        return f"config.position_embedding_type is {position_type!r}, not RoPE from `position_ids`"
    if not any(type(module).__name__.endswith("RotaryEmbedding") for module in model.modules()):
        if any(hasattr(module, "rotary_dim") and hasattr(module, "embed_positions") for module in model.modules()):
            # GPT-J and CodeGen up to transformers 5.23 rotate in attention code of their own (CodeGen's decodes
            # WeDLM windows wrongly there); 5.24 moved both onto a RoPE module and transformers' attention functions
            return "its attention rotates by a sin/cos table of its own; run `pip install 'transformers>=5.24'`"
        return "it has no rotary position embedding (RoPE) to give each slot its logical position"
    nope_layers = [i for i, uses_rope in enumerate(getattr(config, "no_rope_layers", None) or []) if not uses_rope]
    if nope_layers:
        return f"layers {nope_layers} use no position embedding (NoPE, config.no_rope_layers)"
    return None


def _attention_problem(config: PreTrainedConfig) -> str | None:
    other_layers = sorted({kind for kind in getattr(config, "layer_types", None) or [] if kind != "full_attention"})
    if other_layers:
        return (
            f"config.layer_types has {', '.join(repr(kind) for kind in other_layers)} layers; every layer needs full "
            "causal attention over a transformers KV cache"
        )
    chunk = getattr(config, "attention_chunk_size", None)
    if chunk:
        return f"it uses chunked attention (config.attention_chunk_size={chunk}); every layer needs full attention"
    sliding_window = getattr(config, "sliding_window", None)
    if sliding_window and getattr(config, "use_sliding_window", True) is not False:
        return (
            f"it uses sliding-window attention (config.sliding_window={sliding_window}): cached windows are "
            "reordered, so physical distance is not logical distance. Set `model.config.sliding_window = None` if "
            "your contexts fit in full attention"
        )
    return None


def _interface_problem(model: PreTrainedModel) -> str | None:
    parameters = inspect.signature(model.forward).parameters
    missing = [name for name in FORWARD_ARGUMENTS if name not in parameters]
    if missing:
        return f"its forward takes no {', '.join(f'`{name}`' for name in missing)}, which the decoding loop passes"
    if getattr(model, "_is_stateful", False) or not model._supports_default_dynamic_cache():  # 5.25 dropped the flag
        return "it keeps recurrent state rather than a transformers `Cache` of keys and values that can be cropped"
    return None


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why `model` cannot run WeDLM decoding, or None if it can."""
    config = model.config.get_text_config(decoder=True)
    return (
        _decoder_problem(model)
        or _position_problem(model, config)
        or _attention_problem(config)
        or _interface_problem(model)
    )


def check_supported(model: PreTrainedModel) -> None:
    """Raise a ValueError saying what WeDLM needs and which part of `model` lacks it."""
    reason = unsupported_reason(model)
    if reason is not None:
        model_type = getattr(model.config, "model_type", None)
        raise ValueError(
            f"WeDLM decoding cannot drive {type(model).__name__} (model_type {model_type!r}): {reason}. It needs a "
            "decoder-only model whose every layer has full causal attention with RoPE from `position_ids` and a "
            "transformers `Cache`."
        )


def is_wedlm_trained(model: PreTrainedModel) -> bool:
    """Whether the checkpoint says it was trained for WeDLM decoding: its model type, its decoding default, or a
    mask token in its config (a draft-only adapter's gate and `wedlm-hf finetune` set one)."""
    generation_config = getattr(model, "generation_config", None)
    return (
        model.config.model_type == WEDLM
        or getattr(generation_config, "decoding", None) == WEDLM
        or getattr(model.config.get_text_config(), "mask_token_id", None) is not None
    )
