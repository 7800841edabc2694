"""Which generate manager serves a request: transformers' one-request-at-a-time manager with the request's seed and
OpenAI penalties handed to `generate`, or, with continuous batching, WeDLM's batching manager (batching.py)."""

import torch
from transformers import LogitsProcessorList
from transformers.cli.serving import utils as serving_utils

from .batching import WeDLMCBGenerateManager
from .requests import take_carried


class WeDLMGenerateManager(serving_utils.GenerateManager):
    """transformers' manager (`generate` per request, on one inference thread), plus the fields a request's config
    carries (requests.py): its penalties go to `generate` as a logits processor, and its seed is set on the
    inference thread right before its `generate` (transformers sets it when the request arrives, so a request
    decoding meanwhile would draw the seeded numbers)."""

    def generate_streaming(self, model, processor, inputs, gen_config, request_id, response_parser=None):
        inputs = self._with_carried(inputs, gen_config)
        return super().generate_streaming(model, processor, inputs, gen_config, request_id, response_parser)

    async def generate_non_streaming(self, model, processor, inputs, gen_config, request_id):
        inputs = self._with_carried(inputs, gen_config)
        return await super().generate_non_streaming(model, processor, inputs, gen_config, request_id)

    def _with_carried(self, inputs, gen_config) -> dict:
        """`inputs` (the keyword arguments of `generate` besides the config) with the request's processors; its
        seed queued on the inference thread, ahead of the request's `generate`."""
        seed, processors = take_carried(gen_config, inputs["input_ids"].shape[-1])
        if seed is not None:
            self.submit(torch.manual_seed, seed)
        return {**inputs, "logits_processor": LogitsProcessorList(processors)} if processors else inputs


class WeDLMGenerationState(serving_utils.GenerationState):
    """The server's generation state: `WeDLMGenerateManager` per model, and with `batching` (the options of
    `WeDLMCBGenerateManager`) WeDLM's continuous batching; without, transformers' own where it is asked for."""

    def __init__(self, *args, batching: dict | None = None, **kwargs):
        self.batching = None if batching is None else dict(batching)
        super().__init__(*args, **kwargs)

    def use_continuous_batching(self, model, modality) -> bool:
        if self.batching is None:
            return super().use_continuous_batching(model, modality)
        return self._continuous_batching and modality == serving_utils.Modality.LLM

    def get_manager(self, model_id: str, use_cb: bool = False) -> serving_utils.BaseGenerateManager:
        if use_cb and self.batching is not None:
            if self._cb_manager is None:  # `wedlm-hf serve` pins one model: one manager serves it
                self._cb_manager = WeDLMCBGenerateManager(**self.batching)
            return self._cb_manager
        if use_cb:
            return super().get_manager(model_id, use_cb=True)
        if model_id not in self._generate_managers:
            self._generate_managers[model_id] = WeDLMGenerateManager()
        return self._generate_managers[model_id]
