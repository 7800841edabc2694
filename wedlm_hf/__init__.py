"""wedlm-hf: WeDLM parallel decoding for Hugging Face transformers.

Importing the package registers model_type "wedlm" with transformers' Auto classes.
"""

from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .batch import batch_generate
from .cost_profiles.store import install as _install_profile_store
from .draft_adapter.enabling import enable
from .generation import (
    WeDLMCache,
    WeDLMGenerateOutput,
    WeDLMGenerationMixin,
    WeDLMSettings,
    WeDLMStats,
    wedlm_decode,
)
from .modeling import WeDLMConfig, WeDLMForCausalLM, WeDLMModel

AutoConfig.register("wedlm", WeDLMConfig, exist_ok=True)
AutoModel.register(WeDLMConfig, WeDLMModel, exist_ok=True)
AutoModelForCausalLM.register(WeDLMConfig, WeDLMForCausalLM, exist_ok=True)
_install_profile_store()  # measured forward-cost profiles read from and kept in their file (cost_profiles/)

__version__ = "0.1.0"

DEFAULT_MODEL = str(Path(__file__).parent / "checkpoints" / "wedlm-tiny-code")
"""Path of the small WeDLM checkpoint trained by `wedlm-hf train` and shipped inside the package."""

__all__ = [
    "DEFAULT_MODEL",
    "WeDLMCache",
    "WeDLMConfig",
    "WeDLMForCausalLM",
    "WeDLMGenerateOutput",
    "WeDLMGenerationMixin",
    "WeDLMModel",
    "WeDLMSettings",
    "WeDLMStats",
    "batch_generate",
    "enable",
    "wedlm_decode",
]
