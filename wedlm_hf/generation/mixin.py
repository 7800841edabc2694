"""`generate(..., decoding="wedlm")` for WeDLM models, and `enable` for already-loaded supported models."""

import copy
import functools
from collections.abc import Callable

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel, StoppingCriteriaList, StopStringCriteria
from transformers.utils import logging

from .decoding import wedlm_decode
from .support import WEDLM, check_supported, is_wedlm_trained
from .validation import UnsupportedRequest, reject_cache_implementation

AUTOREGRESSIVE = ("ar", "autoregressive")

logger = logging.get_logger(__name__)


class WeDLMGenerationMixin(GenerationMixin):
    """Routes `decoding="wedlm"` to WeDLM decoding; every other call is transformers' own `generate`.

    `decoding` (case-insensitive) is read from the call, else from the generation config (a checkpoint may default
    to WeDLM); `decoding="ar"` forces transformers' usual decoding on such a checkpoint.
    """

    def generate(self, *args, decoding: str | None = None, **kwargs) -> torch.LongTensor:
        generation_config = kwargs.get("generation_config") or self.generation_config
        from_call = decoding is not None
        decoding = _decoding_mode(decoding if from_call else getattr(generation_config, "decoding", None))
        if decoding is None or decoding in AUTOREGRESSIVE:
            return super().generate(*args, **kwargs)
        try:
            reject_cache_implementation(kwargs.get("cache_implementation", generation_config.cache_implementation))
            if kwargs.get("custom_generate") is not None:
                raise UnsupportedRequest(
                    "`decoding='wedlm'` already selects the decoding loop; do not pass `custom_generate` too."
                )
            if kwargs.get("assistant_model") is not None:
                raise UnsupportedRequest(
                    "`decoding='wedlm'` cannot be combined with `assistant_model` (assisted decoding)."
                )
            decode, kwargs = bind_generate_kwargs(self.generation_config, kwargs)
            return super().generate(*args, custom_generate=decode, **kwargs)
        except UnsupportedRequest as error:
            if from_call:
                raise
            raise UnsupportedRequest(
                f"{error} (WeDLM decoding comes from this model's generation config: pass decoding='ar' for "
                "transformers' usual decoding)"
            ) from None


def _decoding_mode(decoding) -> str | None:
    if decoding is None:
        return None
    if isinstance(decoding, str) and decoding.lower() in (WEDLM, *AUTOREGRESSIVE):
        return decoding.lower()
    raise ValueError(f"`decoding` must be 'wedlm' or 'ar', got {decoding!r}.")


def bind_generate_kwargs(model_generation_config: GenerationConfig, kwargs: dict) -> tuple[Callable, dict]:
    """`wedlm_decode` with the `generate` arguments that transformers would not hand to it, and the other kwargs.

    For a `custom_generate` callable, transformers 5.x passes on only the callable's own extra keywords: `streamer`
    and `tokenizer` are dropped, so a streamer would see only the prompt and `stop_strings` would fail for want of
    a tokenizer. The streamer is bound to the callable (it stays in kwargs so `generate` still streams the prompt)
    and stop strings become a `StopStringCriteria` in `stopping_criteria`.
    """
    kwargs = dict(kwargs)
    decode = functools.partial(wedlm_decode, streamer=kwargs.get("streamer"))
    config = kwargs.get("generation_config") or model_generation_config
    stop_strings = kwargs.pop("stop_strings", None) or config.stop_strings
    if stop_strings:
        tokenizer = kwargs.pop("tokenizer", None)
        if tokenizer is None:
            raise ValueError("`stop_strings` needs the model's tokenizer: pass `tokenizer=` to `generate`.")
        criteria = StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings)
        kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), criteria])
        if config.stop_strings:  # transformers would try to build it again, without the tokenizer
            kwargs["generation_config"] = copy.deepcopy(config)
            kwargs["generation_config"].stop_strings = None
    return decode, kwargs


_ENABLED_CLASSES: dict[type, type] = {}


def enable(model: PreTrainedModel) -> PreTrainedModel:
    """Give a loaded model of a family WeDLM supports `generate(decoding="wedlm")`, in place, and return it.

    The object and its weights stay the same; only its class gains `WeDLMGenerationMixin`. The enabled class keeps
    the original's name, so `pipeline(...)` accepts it and `save_pretrained` writes the original architecture. Its
    config, `attn_implementation` included, stays as it was: window forwards ask for the window attention per call
    (`attention.WINDOW_ATTENTION`).

    A model not trained for WeDLM (any plain Llama/Qwen/... checkpoint) predicts wrong tokens at mask slots, so
    plain `decoding="wedlm"` garbles its output; with `wedlm_lossless=True` its output is exactly its greedy
    output (and no faster). `enable` logs this once unless the model is WeDLM-trained (`model_type: "wedlm"`, or a
    generation config with `decoding: "wedlm"`).
    """
    check_supported(model)
    cls = type(model)
    if not is_wedlm_trained(model):
        _recommend_lossless(cls.__name__)
    if issubclass(cls, WeDLMGenerationMixin):
        return model
    if cls not in _ENABLED_CLASSES:
        names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        _ENABLED_CLASSES[cls] = type(cls.__name__, (WeDLMGenerationMixin, cls), names)
    model.__class__ = _ENABLED_CLASSES[cls]
    return model


@functools.cache
def _recommend_lossless(class_name: str) -> None:
    logger.warning(
        f"enable(): this {class_name} was not trained for WeDLM decoding (its config is not model_type "
        "'wedlm' and its generation config does not default to decoding='wedlm'), so plain `decoding=\"wedlm\"` "
        "drafts wrong tokens and garbles its output. Pass `wedlm_lossless=True` too: the output is then exactly "
        "its greedy output (no speed-up on a model not trained for WeDLM)."
    )
