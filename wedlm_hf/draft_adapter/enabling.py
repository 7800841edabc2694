"""`wedlm_hf.enable`: WeDLM decoding for a loaded model, PEFT adapters included.

The exported decoder (`generation/`) knows nothing of PEFT; this wrapper first turns on the gate of any draft-only
adapter the model carries (`attach.py`), then enables the transformers model inside.
"""

from transformers import PreTrainedModel

from ..generation import enable as enable_model
from .attach import gate_draft_only_adapters
from .config import unwrapped


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Give `model` `generate(decoding="wedlm")` in place and return it (see `generation.mixin.enable`).

    `model` may also be a `PeftModel` or a model with adapters loaded by transformers: a draft-only adapter
    (`wedlm-hf finetune --lora-r`) then acts at mask slots only, so lossless decoding returns the base model's greedy
    output; `peft_model.generate(..., decoding="wedlm")` reaches the enabled model through PEFT's own `generate`.
    """
    if getattr(model, "peft_config", None):
        gate_draft_only_adapters(model)
    enable_model(unwrapped(model))
    return model
