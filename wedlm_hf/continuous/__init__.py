"""Continuous batching of WeDLM decoding: a step scheduler, a threaded manager for Python callers, and the
generate manager `wedlm-hf serve --continuous-batching` plugs into transformers serve (docs/serving.md)."""

from .requests import GenerationRequest, RequestResult, RequestUpdate
from .scheduler import WeDLMScheduler

__all__ = ["GenerationRequest", "RequestResult", "RequestUpdate", "WeDLMScheduler"]
