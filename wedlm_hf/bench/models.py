"""Models and tokenizers the benchmarks run on: a checkpoint from disk/Hub, or a random model built in code."""

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..draft_adapter.enabling import enable
from ..loading import load_model_and_tokenizer
from ..modeling import WeDLMConfig, WeDLMForCausalLM

RANDOM_MODEL = "random"
"""`--model random`: the random model of `random_model()`, for developing without a trained checkpoint."""

RANDOM_EOS_ID = 2


def random_model(
    num_layers: int = 4, hidden_size: int = 256, vocab_size: int = 1024, peak: float = 40.0, seed: int = 0
) -> PreTrainedModel:
    """A random WeDLM model (Qwen3 layout) whose lm_head is scaled by `peak`.

    A random head predicts almost uniformly, so no slot would pass an entropy threshold; scaling it spreads the
    entropies and WeDLM then takes multi-slot steps, which is what a speed benchmark has to exercise.
    """
    torch.manual_seed(seed)
    config = WeDLMConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=max(1, hidden_size // 128),
        head_dim=64,
        qk_norm=True,
        max_position_embeddings=8192,
        mask_token_id=vocab_size - 1,
        eos_token_id=RANDOM_EOS_ID,
        pad_token_id=0,
        bos_token_id=1,
    )
    model = WeDLMForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(peak)
    model.generation_config = GenerationConfig(eos_token_id=RANDOM_EOS_ID, pad_token_id=0, do_sample=False)
    return model.eval()


def load_model(name: str | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The model `name` stands for (`wedlm_hf.loading`) with WeDLM decoding enabled, and its tokenizer (None for
    `RANDOM_MODEL`). A model not trained for WeDLM has no mask token: its lossless arms verify every draft, so
    the tokenizer's last id serves (its plain WeDLM arms are what such a model makes of masks it never saw)."""
    if name == RANDOM_MODEL:
        return random_model(), None
    model, tokenizer = load_model_and_tokenizer(name)
    configs = (model.config, model.generation_config)
    if all(getattr(config, "mask_token_id", None) is None for config in configs):
        model.generation_config.mask_token_id = len(tokenizer) - 1
    return enable(model), tokenizer
