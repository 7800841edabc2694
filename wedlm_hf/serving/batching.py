"""WeDLM continuous batching behind `transformers serve`, through the server's own seam: a `BaseGenerateManager`
(as transformers' `CBGenerateManager` is) that hands every request to one `ContinuousBatcher`
(wedlm_hf/continuous/), chosen by the server's generation state (managers.py). The server, its handlers and its
OpenAI API stay transformers' own.

Per request: the prompt, `max_tokens` (not sent: as many as fit the model's positions), `stop` strings, its
sampling with OpenAI's meaning (requests.py: temperature, top_p, top_k, min_p, repetition, frequency and presence
penalties, logit_bias, seed; a seeded request's text does not depend on what else is decoding), streaming and
cancellation (a client that disconnects mid-stream frees its row at the next step). Shared by every request: other logits
processors, EOS and the WeDLM settings, i.e. the model's generation config as `wedlm-hf serve` set it; a request
that asks for other values of those is refused (HTTP 400, naming the request's fields) rather than silently served
with the server's.
"""

import asyncio
from types import SimpleNamespace

from transformers import GenerationConfig, PreTrainedModel
from transformers.cli.serving import utils as serving_utils

from ..continuous.manager import ContinuousBatcher
from ..continuous.requests import GenerationRequest, RequestUpdate
from ..generation.sampling import SamplingParams
from .errors import invalid_request
from .requests import CARRIED, FIELDS
from .streamers import LabelledQueue

PER_REQUEST = {
    "max_new_tokens", "max_length", "stop_strings", "use_cache", "transformers_version",
    "do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "sequence_bias", *CARRIED,
}
"""Generation config fields a request may set (transformers serve sets `use_cache=False` for CB itself)."""
SAMPLING_ONLY = {"typical_p", "epsilon_cutoff", "eta_cutoff"}
"""Fields that change nothing when neither the request nor the server samples (e.g. `temperature=0`)."""
REQUEST_FIELDS = {"do_sample": "temperature", "sequence_bias": "logit_bias"}
"""The request field that sets a generation config field of another name (requests.py); a field that no request
field sets came in the request's `generation_config`."""
BODY_FIELDS = {*FIELDS, "logit_bias"}


def shared_setting_conflicts(request: GenerationConfig, server: GenerationConfig) -> list[str]:
    """The generation config fields `request` sets to values other than the server's shared ones."""
    server_values, default = server.to_dict(), GenerationConfig().to_dict()
    ignored = PER_REQUEST | (SAMPLING_ONLY if not (request.do_sample or server.do_sample) else set())
    return sorted(
        name
        for name, value in request.to_diff_dict().items()
        if name not in ignored and server_values.get(name, default.get(name)) != value
    )


def request_fields(config_fields: list[str]) -> list[str]:
    """The request fields the client sent that set `config_fields`, as the client named them."""
    names = (REQUEST_FIELDS.get(name, name) for name in config_fields)
    return sorted({name if name in BODY_FIELDS else "generation_config" for name in names})


class WeDLMCBGenerateManager(serving_utils.BaseGenerateManager):
    """One `ContinuousBatcher` for the served model, created at its first request."""

    def __init__(
        self, max_batch_size: int = 8, max_batch_tokens: int | None = None, draft_history: int | None = None
    ):
        self.options = {
            "max_batch_size": max_batch_size, "max_batch_tokens": max_batch_tokens, "draft_history": draft_history
        }
        self.batcher: ContinuousBatcher | None = None

    def init_cb(self, model: PreTrainedModel, gen_config: GenerationConfig) -> None:
        """Nothing: the batcher also needs the tokenizer (stop strings), so the first request creates it."""

    def generate_streaming(self, model, processor, inputs, gen_config, request_id, response_parser=None):
        request = self._request(model, processor, inputs, gen_config, request_id)
        loop, text_queue = asyncio.get_running_loop(), LabelledQueue()
        tokenizer = getattr(processor, "tokenizer", processor)._tokenizer
        streamer = serving_utils.CBStreamer(self, request_id, tokenizer, loop, text_queue, response_parser)
        generated: list[int] = []

        def deliver(update: RequestUpdate) -> None:  # on the event loop
            try:
                if update.finished and update.result.error is not None:
                    text_queue.put_nowait(serving_utils._StreamError(update.result.error))
                    return
                for token in update.new_tokens:  # one at a time: the text it decodes to is labelled with it
                    generated.append(token)
                    text_queue.labels.pending.append(token)
                    streamer.put(SimpleNamespace(generated_tokens=generated))  # all CBStreamer reads of an output
                if update.finished:
                    streamer.end()
            except Exception as error:
                text_queue.put_nowait(serving_utils._StreamError(str(error)))

        self._submit(request, lambda update: loop.call_soon_threadsafe(deliver, update))
        return text_queue, streamer

    async def generate_non_streaming(self, model, processor, inputs, gen_config, request_id):
        request = self._request(model, processor, inputs, gen_config, request_id)
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def deliver(update: RequestUpdate) -> None:
            if update.finished and not future.done():
                future.set_result(update.result)

        self._submit(request, lambda update: loop.call_soon_threadsafe(deliver, update))
        try:
            result = await future
        except asyncio.CancelledError:  # the client went away
            self.cancel_request(request_id)
            raise
        if result.error is not None:
            if self.batcher.stopped is not None:  # the engine died: the server cannot serve again (503)
                raise serving_utils.CBWorkerDeadError(result.error)
            raise RuntimeError(f"WeDLM continuous batching failed for request {request_id}: {result.error}")
        text = processor.decode(result.tokens, skip_special_tokens=True)
        return text, len(request.input_ids), result.tokens

    def cancel_request(self, request_id: str) -> None:
        """What `CBStreamer.cancel` calls when a streaming client disconnects."""
        if self.batcher is not None:
            self.batcher.cancel(request_id)

    def is_alive(self) -> bool:
        return self.batcher is None or self.batcher.is_alive()

    def stop(self) -> None:
        if self.batcher is not None:
            self.batcher.close(timeout=5)

    def _submit(self, request: GenerationRequest, listener) -> None:
        try:
            self.batcher.submit_request(request, listener)
        except ValueError as error:  # e.g. a request id already in flight
            raise invalid_request(str(error)) from None
        except RuntimeError as error:  # the decoding thread is gone: the server's health check says so too
            raise serving_utils.CBWorkerDeadError(str(error)) from None

    def _request(self, model, processor, inputs, gen_config: GenerationConfig, request_id: str) -> GenerationRequest:
        """The scheduler's request for one HTTP request, or an HTTP 400 naming what cannot be served. A budget of
        None (the client sent none) becomes as many tokens as fit, written back for the handler's finish reason."""
        if self.batcher is None:
            tokenizer = getattr(processor, "tokenizer", processor)
            self.batcher = ContinuousBatcher(model, model.generation_config, tokenizer=tokenizer, **self.options)
        conflicts = shared_setting_conflicts(gen_config, model.generation_config)
        if conflicts:
            fields = request_fields(conflicts)
            raise invalid_request(
                f"{', '.join(fields)}: with continuous batching, logits processors other than sampling and "
                f"penalties, and WeDLM settings, are the server's for every request (its generation config, set by "
                f"`wedlm-hf serve` options; this request asks for other {', '.join(conflicts)}); drop them from the "
                "request, or serve without --continuous-batching.",
                fields[0],
            )
        input_ids = inputs["input_ids"]
        input_ids = input_ids.flatten().tolist() if hasattr(input_ids, "flatten") else list(input_ids)
        if gen_config.max_new_tokens is None:
            gen_config.max_new_tokens = max(self.batcher.scheduler.max_sequence_length - len(input_ids), 1)
        stop = gen_config.stop_strings
        frequency, presence, seed = (getattr(gen_config, name, None) for name in CARRIED)
        sampling = SamplingParams.from_generation_config(
            gen_config, frequency_penalty=frequency or 0.0, presence_penalty=presence or 0.0, seed=seed
        )
        request = GenerationRequest(
            input_ids, gen_config.max_new_tokens, [stop] if isinstance(stop, str) else stop, request_id, sampling
        )
        try:
            self.batcher.scheduler.check(request)
        except ValueError as error:  # named as the client sent it
            message = str(error).replace("max_new_tokens", "max_tokens")
            raise invalid_request(message, "max_tokens" if "max_tokens" in message else None) from None
        return request
