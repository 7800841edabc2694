"""Turn the gate on for every draft-only adapter a loaded model carries, however it was loaded: `wedlm_hf.loading`,
`PeftModel.from_pretrained(base, folder)`, or transformers' `from_pretrained(folder)` (its PEFT integration)."""

import torch

from .config import draft_only_mask_id, unwrapped


def gate_draft_only_adapters(model: torch.nn.Module):
    """Gate the draft-only adapters of `model` (a `PeftModel` or a transformers model with adapters) and record
    their mask id as the model's; returns the shared `gate.MaskRows`, or None when no adapter is draft-only.

    Idempotent: a second call (e.g. `enable` after `wedlm_hf.loading`) finds the gate already on.
    """
    configs = getattr(model, "peft_config", None) or {}
    marked = {name: mask_id for name, config in configs.items() if (mask_id := draft_only_mask_id(config)) is not None}
    if not marked:
        return None
    if len(set(marked.values())) > 1:
        raise ValueError(f"draft-only adapters with different mask tokens on one model: {marked}")
    from peft.tuners.lora.layer import Linear as LoraLinear, LoraLayer

    from .gate import DraftOnlyLora, MaskRows  # PEFT's variant class: imported once a model needs it

    mask_id = next(iter(marked.values()))
    base = unwrapped(model)
    rows = getattr(base, "_wedlm_mask_rows", None)
    if rows is None:
        rows = MaskRows(mask_id).install(base)
        base._wedlm_mask_rows = rows
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in marked.keys() & module.lora_A.keys():
            if not isinstance(module, LoraLinear):
                raise ValueError(f"draft-only adapters gate linear layers only; {name} is a {type(module).__name__}")
            if module.merged:
                raise ValueError(f"{name}: the draft-only adapter {adapter!r} was merged into the weights; reload it")
            if not isinstance(module.lora_variant.get(adapter), DraftOnlyLora):
                module.lora_variant[adapter] = DraftOnlyLora(rows)
    base.config.get_text_config().mask_token_id = mask_id
    base.generation_config.mask_token_id = mask_id
    return rows
