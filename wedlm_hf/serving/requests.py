"""A request's sampling fields with OpenAI's meaning (and vLLM's extra fields as vLLM reads them), applied to the
generation config transformers serve builds for it.

transformers serve sets a request's `temperature` but leaves sampling to the config's `do_sample` (so on a greedy
model every temperature is greedy), maps `frequency_penalty` to `repetition_penalty = 1 + x` (a multiplicative
penalty on every token seen, prompt included), ignores `presence_penalty` and refuses `top_k`. Here:
- `temperature` above 0 samples at that temperature (with no top-k unless the request or the server sets one:
  transformers would apply its default of 50) and 0 is greedy; without it the server's config decides.
- `top_p`, `top_k` (0 or -1: none) and `min_p` shape sampling; a request that does not sample may send only their
  neutral values (anything else would change nothing, so it is refused naming the field).
- `repetition_penalty` is transformers' (and vLLM's) multiplicative penalty.
- `frequency_penalty` and `presence_penalty` are OpenAI's: logit[t] -= frequency * count(t) + presence *
  [count(t) > 0], counted over the output so far (`OpenAIPenalties`).
- `seed` seeds the request's sampling.
- `logit_bias` (token id -> bias in [-100, 100]) is added to the logits, on both endpoints (transformers' completions
  handler drops it).
The penalties and the seed ride on the config as attributes of those names (`CARRIED`) to the generate manager,
which hands them to `generate` (a logits processor, a seed set right before the call), or, with continuous
batching, into the request's own `SamplingParams`.
"""

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
"""The numeric request fields read here."""
READ_HERE = (*FIELDS, "logit_bias")
"""The request fields read here (the others go to transformers' handlers, whose completions handler drops
`logit_bias`)."""
NEUTRAL = {"top_p": (1,), "top_k": (0, -1), "min_p": (0,)}
"""The sampling-only fields, and their values that change nothing."""
CARRIED = ("frequency_penalty", "presence_penalty", "seed")
BUDGET_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _value(body: dict, name: str):
    value = body[name]
    accepted, expected = FIELDS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not accepted(value):
        raise invalid_request(f"`{name}` must be {expected}, got {value!r}.", name)
    return value


def _logit_bias(value) -> dict[tuple[int], float]:
    """OpenAI's `logit_bias` (token id strings -> bias) as a generation config's `sequence_bias`."""
    valid = isinstance(value, dict) and all(
        str(token).isdigit() and isinstance(bias, (int, float)) and not isinstance(bias, bool) and -100 <= bias <= 100
        for token, bias in value.items()
    )
    if not valid:
        message = f"`logit_bias` must map token ids to numbers in [-100, 100], got {value!r}."
        raise invalid_request(message, "logit_bias")
    return {(int(token),): float(bias) for token, bias in value.items()}


def apply_request_fields(body: dict, config: GenerationConfig) -> None:
    """Set what `body`'s fields of `READ_HERE` ask for on `config` (the request's own copy), or raise an HTTP 400
    naming the field."""
    if body.get("logit_bias"):
        config.sequence_bias = _logit_bias(body["logit_bias"])
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


def names_budget(body: dict) -> bool:
    """Whether the client set the output budget (transformers serve puts in 1,024 new tokens otherwise)."""
    if any(body.get(name) is not None for name in BUDGET_FIELDS):
        return True
    return "max_new_tokens" in json.loads(body.get("generation_config") or "{}")


def take_carried(config: GenerationConfig, prompt_length: int) -> tuple[int | None, list[LogitsProcessor]]:
    """Remove the carried fields from `config`: the request's seed, and its penalties as logits processors."""
    frequency, presence, seed = (config.__dict__.pop(name, None) for name in CARRIED)
    penalties = [OpenAIPenalties(prompt_length, frequency or 0.0, presence or 0.0)] if frequency or presence else []
    return seed, penalties
