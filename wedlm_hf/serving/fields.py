"""Every field of OpenAI's completions and chat-completions requests, and what `wedlm-hf serve` does with it: served
(here, by transformers' handlers or by the engine), or refused by name (HTTP 400, `param` the field) unless its value
asks for nothing beyond what the server does anyway. transformers serve logs "Ignoring unsupported fields" and
answers as if they had not been sent; a client asking for JSON output, a tool choice or a stored completion would
never learn it did not get one. docs/serving.md shows this table.
"""

import logging

from .errors import invalid_request

logger = logging.getLogger(__name__)

SERVED = {
    "model": "the served model's name (a server is pinned to one)",
    "prompt": "a string, a list of token ids, or a list of either (one choice each)",
    "messages": "through the model's chat template",
    "max_tokens": "the output budget (omitted: as many as fit the model's positions); 0 with `echo`: the prompt alone",
    "max_completion_tokens": "the output budget, as `max_tokens`",
    "temperature": "0 greedy, above 0 samples at that temperature",
    "top_p": "nucleus sampling",
    "stop": "stop strings (the output ends before them)",
    "stream": "server-sent events",
    "stream_options": "`include_usage`: the usage chunk, sent unless false",
    "n": "n choices, each its own request in the batch (a seeded one: seed, seed + 1, ...)",
    "best_of": "equal to `n` (ranking more samples than are returned is not served)",
    "logprobs": "each token's log-probability under the model, with the `top_logprobs` / `logprobs` most likely",
    "top_logprobs": "with `logprobs`: that many alternatives per token (at most 20)",
    "echo": "the prompt before the output (with `logprobs`: the prompt's log-probabilities too)",
    "frequency_penalty": "OpenAI's: minus x per earlier occurrence in the output",
    "presence_penalty": "OpenAI's: minus x once a token occurs in the output",
    "logit_bias": "added to the token's logit at every step",
    "seed": "seeds the request's sampling (the same text whatever decodes beside it)",
    "tools": "rendered by the chat template (refused where the template ignores them); calls parsed from the output",
    "user": "written to the server's log with the request id",
    "safety_identifier": "written to the server's log with the request id",
    "top_k": "(vLLM's) top-k sampling; 0 or -1: none",
    "min_p": "(vLLM's) min-p sampling",
    "repetition_penalty": "(vLLM's, transformers') multiplicative penalty on every token seen",
    "generation_config": "(transformers serve's) a JSON generation config for this request",
    "chat_template_kwargs": "(transformers serve's) extra chat template arguments",
}
"""Fields served, and how."""

REFUSED = {  # field: (values that ask for nothing beyond the default, why any other value cannot be served)
    "tool_choice": ((None, "auto"), "nothing constrains the output to call a tool, a given one, or none"),
    "parallel_tool_calls": ((None, True), "every call in the output is returned; nothing limits it to one"),
    "suffix": ((None, ""), "the model has no fill-in-the-middle; send the text before the gap as the prompt"),
    "response_format": (({"type": "text"},), "outputs are not constrained to JSON or a schema"),
    "audio": ((None,), "the model writes text only"),
    "modalities": ((["text"],), "the model writes text only"),
    "functions": ((None,), "deprecated by OpenAI: send `tools`"),
    "function_call": ((None,), "deprecated by OpenAI: send `tool_choice`"),
    "prediction": ((None,), "predicted outputs are not used as drafts"),
    "reasoning_effort": ((None,), "the model does not reason before answering"),
    "verbosity": ((None,), "the model has no verbosity control"),
    "web_search_options": ((None,), "the server has no web search"),
    "moderation": ((None,), "the server runs no moderation"),
    "store": ((None, False), "the server stores no completions"),
    "metadata": ((None, {}), "the server stores no completions to tag"),
    "service_tier": ((None, "auto", "default"), "the server has one tier"),
    "prompt_cache_key": ((None,), "the server keeps no prompt cache"),
    "prompt_cache_options": ((None,), "the server keeps no prompt cache"),
    "prompt_cache_retention": ((None,), "the server keeps no prompt cache"),
}

COMPLETIONS = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "stop", "stream", "stream_options", "n", "best_of",
    "logprobs", "echo", "frequency_penalty", "presence_penalty", "logit_bias", "seed", "user", "suffix",
    "top_k", "min_p", "repetition_penalty", "generation_config",
}
CHAT_COMPLETIONS = (set(SERVED) | set(REFUSED)) - {"prompt", "best_of", "echo", "suffix"}
"""The fields each endpoint takes (OpenAI's, vLLM's sampling extras and transformers serve's own)."""
IDENTITIES = ("user", "safety_identifier")


def check_fields(body: dict, accepted: set[str]) -> None:
    """Raise an HTTP error naming the first field of `body` that is unknown to the endpoint (422) or asks for what
    the server cannot serve (400)."""
    unknown = sorted(set(body) - accepted)
    if unknown:
        raise invalid_request(f"Unexpected fields in the request: {set(unknown)}", unknown[0], status=422)
    for name, (neutral, reason) in REFUSED.items():
        if name in body and body[name] not in neutral:
            raise invalid_request(f"`{name}` is not served: {reason}; drop it.", name)


def end_user(body: dict) -> dict:
    """The end-user identifiers `body` names (`user`, `safety_identifier`), for the server's log."""
    return {name: body[name] for name in IDENTITIES if body.get(name) is not None}


def log_end_user(request_id: str, identities: dict) -> None:
    if identities:
        logger.info("request %s: %s", request_id, ", ".join(f"{name} {value!r}" for name, value in identities.items()))
