"""The LoRA adapter a fine-tuning run trains: draft-only (the default, `wedlm_hf.draft_adapter`) or whole-model."""

from transformers import PreTrainedModel

from ..draft_adapter import draft_only_lora_config, gate_draft_only_adapters, linear_module_names
from ..loading.peft_compat import peft_deprecations_silenced

def with_draft_only_lora(model: PreTrainedModel, rank: int, alpha: int, mask_id: int):
    """The model wrapped in a draft-only PEFT LoRA adapter on every linear layer of its decoder blocks, gated.

    The mask token's embedding row is not trained: with tied embeddings (SmolLM2) PEFT would train the tied output
    row too, changing that token's logit at every position; the adapter's first layers learn from the row as it is.
    """
    peft = _peft()
    config = draft_only_lora_config(rank, alpha, linear_module_names(model), mask_id)
    with peft_deprecations_silenced():
        model = peft.get_peft_model(model, config)
    gate_draft_only_adapters(model)
    return model


def with_lora(model: PreTrainedModel, rank: int, alpha: int, train_token: int | None):
    """The model wrapped in a PEFT LoRA adapter on every linear layer, with the mask token's embedding row
    trainable when it was chosen for this run (its old meaning is no use to WeDLM)."""
    peft = _peft()
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules="all-linear",
        trainable_token_indices=[train_token] if train_token is not None else None,
        task_type="CAUSAL_LM",
    )
    with peft_deprecations_silenced():
        return peft.get_peft_model(model, config)


def _peft():
    try:
        import peft
    except ImportError as error:
        raise ImportError("--lora-r needs PEFT: pip install 'wedlm-hf[finetune]'") from error
    return peft
