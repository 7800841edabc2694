"""Continuous batching of WeDLM decoding: a step scheduler with a replaceable admission policy, a threaded manager
for Python callers, and the generate manager `wedlm-hf serve --continuous-batching` plugs into transformers serve
(docs/serving.md)."""

from .admission import AdmissionPolicy, FirstComeFirstServed
from .requests import GenerationRequest, RequestResult, RequestUpdate
from .scheduler import WeDLMScheduler
from .sequence import Sequence

__all__ = [
    "AdmissionPolicy", "FirstComeFirstServed", "GenerationRequest", "RequestResult", "RequestUpdate", "Sequence",
    "WeDLMScheduler",
]
