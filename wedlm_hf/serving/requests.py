"""A request's fields with OpenAI's meaning (and vLLM's extra sampling fields as vLLM reads them), read into the
generation config the request decodes with: a copy of the server's (or the `generation_config` JSON the request
sends, which replaces it, `decoding` included).

Sampling, as OpenAI and vLLM mean it (transformers' own `generate` defaults differ):
- `temperature` above 0 samples at that temperature (with no top-k unless the request or the server sets one:
  `generate()` would apply its default of 50) and 0 is greedy; without it the server's config decides.
- `top_p`, `top_k` (0 or -1: none) and `min_p` shape sampling; a request that does not sample may send only their
  neutral values (anything else would change nothing, so it is refused naming the field).
- `repetition_penalty` is transformers' (and vLLM's) multiplicative penalty.
- `frequency_penalty` and `presence_penalty` are OpenAI's: logit[t] -= frequency * count(t) + presence *
  [count(t) > 0], counted over the output so far (`OpenAIPenalties`).
- `seed` seeds the request's sampling.
The penalties and the seed ride on the config as attributes of those names (`CARRIED`) to the engine, which hands
them to `generate` (a logits processor, a seed set right before the call), or, with continuous batching, into the
request's own `SamplingParams`. A field of OpenAI's API that this server does not honour is refused by name unless
it has its neutral value (`UNSERVED`); any other unknown field is a 422.
"""

import copy
import json

from transformers import GenerationConfig, LogitsProcessor

from ..generation.penalties import OpenAIPenalties
from .errors import invalid_request

FIELDS = {  # field: (accepted, what it must be)
    "temperature": (lambda v: v >= 0, "a number >= 0 (0: greedy)"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: isinstance(v, int) and v >= -1, "an integer >= 1, or 0 or -1 for none"),
    "min_p": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (lambda v: v > 0, "a number > 0 (1: none)"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "seed": (lambda v: isinstance(v, int) and -(2**63) <= v < 2**64, "an integer"),
}
"""The sampling fields (the penalties and the seed too): what each must be."""
NEUTRAL = {"top_p": (1,), "top_k": (0, -1), "min_p": (0,)}
"""The sampling-only fields, and their values that change nothing."""
CARRIED = ("frequency_penalty", "presence_penalty", "seed")
BUDGET_FIELDS = ("max_completion_tokens", "max_tokens")
"""The output budget's fields, the first given wins (chat completions take both)."""
COMMON = {"model", "stream", "stream_options", "stop", "logit_bias", "user", "generation_config", *FIELDS}
COMPLETION_FIELDS = COMMON | {"prompt", "max_tokens"}
CHAT_FIELDS = COMMON | {"messages", "chat_template_kwargs", *BUDGET_FIELDS}
UNSERVED = {
    "n": (1,), "best_of": (1,), "echo": (False,), "suffix": (None, ""), "logprobs": (None, False, 0),
    "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
}
"""OpenAI fields this server does not honour, with the values that ask for nothing."""
LOGIT_BIAS_LIMIT = 100


def _value(body: dict, name: str):
    value = body[name]
    accepted, expected = FIELDS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not accepted(value):
        raise invalid_request(f"`{name}` must be {expected}, got {value!r}.", name)
    return value


def apply_request_fields(body: dict, config: GenerationConfig) -> None:
    """Set what `body`'s fields of `FIELDS` ask for on `config` (the request's own copy), or raise an HTTP 400
    naming the field."""
    values = {name: _value(body, name) for name in FIELDS if body.get(name) is not None}
    temperature = values.get("temperature")
    if temperature is not None:
        config.do_sample = temperature > 0
        if temperature > 0:
            config.temperature = float(temperature)
            if config.top_k is None:  # OpenAI's meaning: no top-k unless asked (`generate()` would apply 50)
                config.top_k = 0
    for name, neutral in NEUTRAL.items():
        if name not in values:
            continue
        if config.do_sample:
            setattr(config, name, 0 if name == "top_k" and values[name] == -1 else values[name])
        elif values[name] not in neutral:
            raise invalid_request(
                f"`{name}` shapes sampling, and this request does not sample (the server's default is greedy "
                f"decoding): send `temperature` above 0 with it, or drop `{name}`.",
                name,
            )
    if "repetition_penalty" in values:
        config.repetition_penalty = float(values["repetition_penalty"])
    for name in CARRIED:
        if name in values and (name == "seed" or values[name] != 0):  # a zero penalty is none
            setattr(config, name, values[name])


def check_fields(body: dict, accepted: set[str]) -> None:
    """Refuse a field the endpoint does not know (422, as for a malformed body), or one of `UNSERVED` asking for
    something (400, naming it)."""
    unexpected = set(body) - accepted - UNSERVED.keys()
    if unexpected:
        raise invalid_request(f"Unexpected fields in the request: {unexpected}", min(unexpected), status=422)
    for name in sorted(UNSERVED.keys() & body.keys()):
        if body[name] not in UNSERVED[name]:
            raise invalid_request(f"`{name}` is not served here: drop it, or send {UNSERVED[name][0]!r}.", name)


def request_config(body: dict, server_config: GenerationConfig) -> GenerationConfig:
    """The request's own generation config: the `generation_config` JSON it sends, else a copy of the server's,
    with its fields applied; `max_new_tokens` is None when it names no budget (the engine then gives as many
    tokens as fit). Raises an HTTP 400 naming the field at fault."""
    sent = _sent_config(body)
    config = copy.deepcopy(server_config) if sent is None else sent
    budget = next((name for name in BUDGET_FIELDS if body.get(name) is not None), None)
    if budget is not None:
        value = body[budget]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid_request(f"`{budget}` must be an integer >= 1, got {value!r}.", budget)
        config.max_new_tokens = value
    elif sent is None:  # a sent config without one has none already
        config.max_new_tokens = None
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(text, str) and text for text in stop):
            raise invalid_request("`stop` must be a string or a list of non-empty strings.", "stop")
        config.stop_strings = stop or None
    if body.get("logit_bias"):
        config.sequence_bias = _logit_bias(body["logit_bias"])
    apply_request_fields(body, config)
    return config


def _sent_config(body: dict) -> GenerationConfig | None:
    """The generation config a request sends as a JSON string (transformers serve's field, kept), or None."""
    text = body.get("generation_config")
    if text is None:
        return None
    try:
        sent = json.loads(text) if isinstance(text, str) else None
        if not isinstance(sent, dict):
            raise ValueError("it must be a string holding a JSON object")
        return GenerationConfig(**sent)  # which checks its values
    except (TypeError, ValueError) as error:
        raise invalid_request(f"`generation_config`: {error}", "generation_config") from None


def _logit_bias(bias: object) -> dict[tuple[int], float]:
    """OpenAI's `logit_bias` ({"token id": bias in [-100, 100]}) as transformers' single-token `sequence_bias`."""
    try:
        pairs = {(int(token),): float(value) for token, value in bias.items()}
    except (AttributeError, TypeError, ValueError):
        pairs = None
    if pairs is None or any(abs(value) > LOGIT_BIAS_LIMIT for value in pairs.values()):
        raise invalid_request(
            f"`logit_bias` must map token ids to numbers in [-{LOGIT_BIAS_LIMIT}, {LOGIT_BIAS_LIMIT}].", "logit_bias"
        )
    return pairs


def take_carried(config: GenerationConfig, prompt_length: int) -> tuple[int | None, list[LogitsProcessor]]:
    """Remove the carried fields from `config`: the request's seed, and its penalties as logits processors."""
    frequency, presence, seed = (config.__dict__.pop(name, None) for name in CARRIED)
    penalties = [OpenAIPenalties(prompt_length, frequency or 0.0, presence or 0.0)] if frequency or presence else []
    return seed, penalties
