"""A pointer to `wedlm_hf.enable` when a model that was never enabled gets `generate(decoding=...)`.

Without it transformers rejects the keyword as an unused model kwarg ("typos in the generate arguments will also
show up in this list"), which does not say what is missing. Installed by `import wedlm_hf` only (not in exported
remote code); it changes nothing but that error's message.
"""

import functools

from transformers import GenerationMixin

from .generation import WeDLMGenerationMixin


def install() -> None:
    validate = GenerationMixin._validate_model_kwargs
    if getattr(validate, "_wedlm_hint", False):
        return

    @functools.wraps(validate)
    def validate_model_kwargs(self, model_kwargs: dict) -> None:
        if "decoding" in model_kwargs and not isinstance(self, WeDLMGenerationMixin):
            raise ValueError(
                f"`decoding={model_kwargs['decoding']!r}`: this {type(self).__name__} has no WeDLM decoding yet; call "
                "`wedlm_hf.enable(model)` first, or pass "
                "`custom_generate=wedlm_hf.wedlm_decode` instead of `decoding`."
            )
        validate(self, model_kwargs)

    validate_model_kwargs._wedlm_hint = True
    GenerationMixin._validate_model_kwargs = validate_model_kwargs
