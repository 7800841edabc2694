"""`transformers serve` (the OpenAI-compatible server of transformers) with WeDLM decoding.

The server loads a model by looking its architecture up by name in the `transformers` namespace, so it finds
neither `WeDLMForCausalLM` nor `auto_map`, and it never passes `decoding`. Two hooks fix both and leave the server
itself untouched: the WeDLM classes are made visible under their names, and a `ModelManager` subclass enables each
loaded model and makes WeDLM the default of its generation config, which every request's config is copied from.
With continuous batching, a `GenerationState` subclass hands requests to WeDLM's own batching manager
(`wedlm_hf.continuous.serve_manager`) instead of transformers' paged-attention one.
"""

from transformers import GenerationConfig, PreTrainedModel
from transformers.cli.serving import model_manager

import wedlm_hf
from wedlm_hf.generation.options import BY_KEYWORD, SERVE, exposed_to

GENERATION_OPTIONS = tuple(option.keyword for option in exposed_to(SERVE))
"""Generation config attributes that `serve` may set for every request."""


class WeDLMModelManager(model_manager.ModelManager):
    """Loads models as transformers serve does, then gives them `decoding="wedlm"` by default."""

    generation_defaults: dict = {}

    def _load_model(self, *args, **kwargs) -> PreTrainedModel:
        model = wedlm_hf.enable(super()._load_model(*args, **kwargs))
        config: GenerationConfig = model.generation_config
        config.decoding = "wedlm"
        for name, value in self.generation_defaults.items():
            setattr(config, name, value)
        return model


def install(generation_defaults: dict, batching: dict | None = None) -> None:
    """Make `transformers serve` load WeDLM models with WeDLM decoding, with these generation config overrides;
    with `batching` (`WeDLMCBGenerateManager` options), continuous-batching requests go to WeDLM's scheduler."""
    unknown = set(generation_defaults) - set(GENERATION_OPTIONS)
    if unknown:
        raise ValueError(f"serve cannot set {sorted(unknown)}; settable: {', '.join(GENERATION_OPTIONS)}")
    for name, value in generation_defaults.items():
        BY_KEYWORD[name].checked(value)
    namespace = model_manager.transformers  # where the server looks architectures up by name
    for cls in (wedlm_hf.WeDLMForCausalLM, wedlm_hf.WeDLMModel, wedlm_hf.WeDLMConfig):
        setattr(namespace, cls.__name__, cls)
    WeDLMModelManager.generation_defaults = dict(generation_defaults)
    model_manager.ModelManager = WeDLMModelManager
    if batching is not None:
        from transformers.cli.serving import utils as serving_utils

        from .continuous.serve_manager import WeDLMGenerationState

        WeDLMGenerationState.batching = dict(batching)
        serving_utils.GenerationState = WeDLMGenerationState  # where `Serve` looks it up when it starts


def serve(
    model: str, *, host: str, port: int, generation_defaults: dict, batching: dict | None = None, **server_options
):
    """Run `transformers serve` pinned to `model`: until interrupted, or in a thread with `non_blocking=True`
    (then stop it with the returned server's `kill_server()`); with `batching` (max_batch_size, max_batch_tokens),
    requests are continuously batched by WeDLM's scheduler."""
    from transformers.cli.serve import Serve
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise ImportError("`wedlm-hf serve` needs transformers' serving dependencies: pip install 'wedlm-hf[serve]'")
    install(generation_defaults, batching)
    return Serve(
        force_model=model, host=host, port=port, continuous_batching=batching is not None, **server_options
    )
