"""`generate(..., decoding="wedlm")` for WeDLM models, and `enable` for already-loaded supported models."""

import torch
from transformers import GenerationMixin, PreTrainedModel

from .decoding import wedlm_decode
from .support import check_supported

WEDLM = "wedlm"
AUTOREGRESSIVE = ("ar", "autoregressive")


class WeDLMGenerationMixin(GenerationMixin):
    """Routes `decoding="wedlm"` to WeDLM decoding; every other call is transformers' own `generate`.

    `decoding` is read from the call, else from the generation config (a checkpoint may default to WeDLM);
    `decoding="ar"` forces transformers' usual decoding on such a checkpoint.
    """

    def generate(self, *args, decoding: str | None = None, **kwargs) -> torch.LongTensor:
        generation_config = kwargs.get("generation_config") or self.generation_config
        decoding = decoding if decoding is not None else getattr(generation_config, "decoding", None)
        if decoding is None or decoding in AUTOREGRESSIVE:
            return super().generate(*args, **kwargs)
        if decoding != WEDLM:
            raise ValueError(f"`decoding` must be 'wedlm' or 'ar', got {decoding!r}.")
        if kwargs.get("custom_generate") is not None:
            raise ValueError("`decoding='wedlm'` already selects the decoding loop; do not pass `custom_generate` too.")
        if kwargs.get("assistant_model") is not None:
            raise ValueError("`decoding='wedlm'` cannot be combined with `assistant_model` (assisted decoding).")
        return super().generate(*args, custom_generate=wedlm_decode, **kwargs)


_ENABLED_CLASSES: dict[type, type] = {}


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Give a loaded Llama, Mistral, Qwen2 or Qwen3 model `generate(decoding="wedlm")`, in place, and return it.

    The object and its weights stay the same; only its class gains `WeDLMGenerationMixin`.
    """
    check_supported(model)
    cls = type(model)
    if issubclass(cls, WeDLMGenerationMixin):
        return model
    if cls not in _ENABLED_CLASSES:
        _ENABLED_CLASSES[cls] = type(f"WeDLM{cls.__name__}", (WeDLMGenerationMixin, cls), {"__module__": cls.__module__})
    model.__class__ = _ENABLED_CLASSES[cls]
    return model
