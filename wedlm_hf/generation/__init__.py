"""WeDLM decoding: the strategy, its cache and the cache-free reference it is tested against."""

from .cache import WeDLMCache
from .decoding import wedlm_decode
from .mixin import WeDLMGenerationMixin, enable
from .outputs import WeDLMGenerateOutput, WeDLMStats
from .settings import WeDLMSettings

__all__ = [
    "WeDLMCache",
    "WeDLMGenerateOutput",
    "WeDLMGenerationMixin",
    "WeDLMSettings",
    "WeDLMStats",
    "enable",
    "wedlm_decode",
]
