"""WeDLM continuous batching behind `wedlm-hf serve`: `BatchingEngine` hands every request to one
`ContinuousBatcher` (wedlm_hf/continuous/), which decodes them together.

Per request: the prompt, `max_tokens` (not sent: as many as fit the model's positions), `stop` strings, its
sampling with OpenAI's meaning (requests.py: temperature, top_p, top_k, min_p, repetition, frequency and presence
penalties, logit_bias, seed; a seeded request's text does not depend on what else is decoding), streaming and
cancellation (a client that disconnects mid-stream frees its row at the next step). Shared by every request: other
logits processors, EOS and the WeDLM settings, i.e. the model's generation config as `wedlm-hf serve` set it; a
request that asks for other values of those is refused (HTTP 400, naming the request's fields) rather than silently
served with the server's.
"""

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..continuous.manager import ContinuousBatcher
from ..continuous.requests import GenerationRequest, RequestResult, RequestUpdate
from ..generation.outputs import LENGTH, STOP
from ..generation.sampling import SamplingParams
from .errors import EngineStopped, invalid_request
from .managers import Job, Output
from .requests import CARRIED, FIELDS

PER_REQUEST = {
    "max_new_tokens", "max_length", "stop_strings", "use_cache", "transformers_version",
    "do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "sequence_bias", *CARRIED,
}
"""Generation config fields a request may set."""
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


class BatchingEngine:
    """One `ContinuousBatcher` for the served model, which every request joins at a step boundary."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, max_batch_size: int = 8,
        max_batch_tokens: int | None = None, draft_history: int | None = None,
    ):
        self.model = model
        self.batcher = ContinuousBatcher(
            model, model.generation_config, tokenizer=tokenizer, max_batch_size=max_batch_size,
            max_batch_tokens=max_batch_tokens, draft_history=draft_history,
        )
        self.max_sequence_length = self.batcher.scheduler.max_sequence_length

    def submit(self, job: Job) -> None:
        request = self._request(job)

        def deliver(update: RequestUpdate) -> None:  # on the decoding thread
            if update.new_tokens:
                job.outputs.put(list(update.new_tokens))
            if update.finished:
                job.outputs.put(self._end(update.result))

        try:
            self.batcher.submit_request(request, deliver)
        except ValueError as error:  # e.g. a request id already in flight
            raise invalid_request(str(error)) from None
        except RuntimeError as error:  # the decoding thread is gone: the server's health check says so too
            raise EngineStopped(str(error)) from None

    def cancel(self, request_id: str) -> None:
        self.batcher.cancel(request_id)

    def is_alive(self) -> bool:
        return self.batcher.is_alive()

    def close(self) -> None:
        self.batcher.close(timeout=5)

    def _end(self, result: RequestResult) -> Output:
        if result.error is None:
            return LENGTH if result.finish_reason == LENGTH else STOP
        if self.batcher.stopped is not None:  # the engine died: the server cannot serve again (503)
            return EngineStopped(result.error)
        return RuntimeError(f"WeDLM continuous batching failed for request {result.request_id}: {result.error}")

    def _request(self, job: Job) -> GenerationRequest:
        """The scheduler's request for `job`, or an HTTP 400 naming what cannot be served."""
        config = job.config
        conflicts = shared_setting_conflicts(config, self.model.generation_config)
        if conflicts:
            fields = request_fields(conflicts)
            raise invalid_request(
                f"{', '.join(fields)}: with continuous batching, logits processors other than sampling and "
                f"penalties, and WeDLM settings, are the server's for every request (its generation config, set by "
                f"`wedlm-hf serve` options; this request asks for other {', '.join(conflicts)}); drop them from the "
                "request, or serve without --continuous-batching.",
                fields[0],
            )
        stop = config.stop_strings
        frequency, presence, seed = (getattr(config, name, None) for name in CARRIED)
        sampling = SamplingParams.from_generation_config(
            config, frequency_penalty=frequency or 0.0, presence_penalty=presence or 0.0, seed=seed
        )
        request = GenerationRequest(
            job.input_ids, config.max_new_tokens, [stop] if isinstance(stop, str) else stop, job.request_id, sampling
        )
        try:
            self.batcher.scheduler.check(request)
        except ValueError as error:  # named as the client sent it
            message = str(error).replace("max_new_tokens", "max_tokens")
            raise invalid_request(message, "max_tokens" if "max_tokens" in message else None) from None
        return request
