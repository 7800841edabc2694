"""Tiny random models of every supported family, built in code (no downloads)."""

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from wedlm_hf import WeDLMConfig, WeDLMForCausalLM

VOCAB = 96
MASK_ID = 95
EOS_ID = 2
PAD_ID = 0
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "wedlm", "wedlm-qwen2")

SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
    bos_token_id=1,
)


def tiny_model(family: str, seed: int = 0, peak: float = 12.0, attn: str = "sdpa"):
    """A random `family` model whose lm_head is scaled by `peak` so some predictions are confident.

    Random heads are nearly uniform; scaling makes entropies spread, so WeDLM takes multi-slot steps. The mask
    token's logit is 0 while the largest of the other 95 random logits is almost surely positive.
    """
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=None))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16))
    elif family in ("wedlm", "wedlm-qwen2"):
        config = WeDLMConfig(**SHAPE, head_dim=16, attention_bias=family == "wedlm-qwen2", mask_token_id=MASK_ID)
        model = WeDLMForCausalLM(config)
    else:
        raise ValueError(family)
    return _sharpened(model, peak, attn)


def tiny_family_model(model_type: str, seed: int = 0, peak: float = 40.0, **config_overrides):
    """A random model of any transformers `model_type` at the tiny shape (untied head), sharpened like `tiny_model`."""
    config = AutoConfig.for_model(model_type, **{**SHAPE, "tie_word_embeddings": False, **config_overrides})
    torch.manual_seed(seed)
    return _sharpened(AutoModelForCausalLM.from_config(config), peak, "sdpa")


def _sharpened(model, peak: float, attn: str):
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.mul_(peak)
        head[MASK_ID] = 0  # like a trained WeDLM model: the mask is never a next-token prediction
    model.generation_config = GenerationConfig(eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False)
    model.config._attn_implementation = attn
    return model.eval()


def random_prompts(lengths, seed: int = 0, low: int = 3):
    """Left-padded batch of random prompts (tokens avoid pad, BOS, EOS and the mask id)."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, width - length :] = torch.randint(low, MASK_ID, (length,), generator=generator)
        attention_mask[row, width - length :] = 1
    return input_ids, attention_mask
