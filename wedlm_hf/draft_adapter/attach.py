"""Turn the gate on for every draft-only adapter a loaded model carries, however it was loaded: `wedlm_hf.loading`,
`PeftModel.from_pretrained(base, folder)`, or transformers' `from_pretrained(folder)` (its PEFT integration)."""

import torch

from .config import draft_only_defaults, draft_only_mask_id, unwrapped


def gate_draft_only_adapters(model: torch.nn.Module) -> int | None:
    """Gate the draft-only adapters of `model` (a `PeftModel` or a transformers model with adapters) and record
    their mask id as the model's; returns that mask id, or None when no adapter is draft-only.

    Gating them the first time also sets the decoding defaults their folder declared (`config.py`) on the model's
    generation config, which loading by PEFT or transformers takes from the base model. Idempotent: a second call
    (e.g. `enable` after `wedlm_hf.loading`, which sets the folder's whole generation config) changes nothing.
    """
    configs = getattr(model, "peft_config", None) or {}
    marked = {name: mask_id for name, config in configs.items() if (mask_id := draft_only_mask_id(config)) is not None}
    if not marked:
        return None
    if len(set(marked.values())) > 1:
        raise ValueError(f"draft-only adapters with different mask tokens on one model: {marked}")
    defaults = {name: draft_only_defaults(configs[name]) for name in marked}
    if len({repr(sorted(found.items())) for found in defaults.values() if found}) > 1:
        raise ValueError(f"draft-only adapters with different decoding defaults on one model: {defaults}")
    from peft.tuners.lora.layer import Linear as LoraLinear, LoraLayer

    from .gate import DraftOnlyLora, gate  # PEFT's variant class: imported once a model needs it

    base, gated = unwrapped(model), False
    for name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in marked.keys() & module.lora_A.keys():
            if not isinstance(module, LoraLinear):
                raise ValueError(f"draft-only adapters gate linear layers only; {name} is a {type(module).__name__}")
            if module.merged:
                raise ValueError(f"{name}: the draft-only adapter {adapter!r} was merged into the weights; reload it")
            if not isinstance(module.lora_variant.get(adapter), DraftOnlyLora):
                gate(module, adapter)
                gated = True
    mask_id = next(iter(marked.values()))
    if gated:
        for key, value in next((found for found in defaults.values() if found), {}).items():
            setattr(base.generation_config, key, value)
    base.config.get_text_config().mask_token_id = mask_id
    base.generation_config.mask_token_id = mask_id
    return mask_id
