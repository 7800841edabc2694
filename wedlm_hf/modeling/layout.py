"""The layout rule of a WeDLM config, with no imports: `WeDLMConfig` applies it, and so does the vLLM plugin's
config, which loads this file alone because importing its package would load torch and transformers in every
process vLLM starts.

The rule follows the authors' engine, which reads only `attention_bias`: q/k/v bias without q/k norm (Qwen2.5
layers, WeDLM-7B) when it is true, q/k norm without bias (Qwen3 layers, WeDLM-8B) when it is false; `head_dim`
defaults to `hidden_size // num_attention_heads`; a Qwen vocabulary without a mask id takes the public checkpoints'.
"""

QWEN_MASK_TOKEN_ID = 151665
"""The mask id of the public WeDLM checkpoints (the authors' engine falls back to it when a config has none)."""
QWEN_VOCAB_SIZES = (151936, 152064)
"""Embedding rows of the Qwen tokenizers' models (152064: Qwen2.5-7B and larger), where that fallback applies."""


def apply_layout(config) -> bool:
    """Fill `head_dim`, `attention_bias`, `qk_norm` and `mask_token_id` of a WeDLM config in place; ValueError for a
    layout no WeDLM checkpoint has. Returns whether the Qwen mask id was filled in (the caller says so)."""
    if config.head_dim is None:
        config.head_dim = config.hidden_size // config.num_attention_heads
    if config.attention_bias is None:
        config.attention_bias = True if config.qk_norm is None else not config.qk_norm
    if config.qk_norm is None:
        config.qk_norm = not config.attention_bias
    if config.qk_norm == config.attention_bias:
        raise ValueError(
            f"WeDLM config has attention_bias={config.attention_bias} and qk_norm={config.qk_norm}, which contradict: "
            "WeDLM layers have q/k norm exactly when attention_bias is false (Qwen3 layout) and q/k/v bias without "
            "q/k norm when it is true (Qwen2.5 layout). Remove `qk_norm` from config.json (it follows "
            "`attention_bias`) or set it to `not attention_bias`."
        )
    if config.mask_token_id is None and config.vocab_size in QWEN_VOCAB_SIZES:
        config.mask_token_id = QWEN_MASK_TOKEN_ID
        return True
    return False
