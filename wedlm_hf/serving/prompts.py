"""A request's prompt: the completions API's four forms (a string, a list of token ids, or a list of either, one
choice each), and a bound on its size checked before anything is tokenized. A token covers at most as many
characters as the vocabulary's longest entry, so a prompt of C characters has at least C / longest tokens: past
the model's positions, it is refused at once instead of after seconds of tokenizing a request that cannot be
served.
"""

import functools
import math

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .choices import Prompt
from .errors import invalid_request

FORMS = "a string, a list of token ids, or a non-empty list of strings or of token-id lists"


@functools.lru_cache(maxsize=8)
def longest_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """Characters of the vocabulary's longest entry (byte-level vocabularies spell each byte as one character, so
    this bounds the characters of any token from above)."""
    return max(map(len, tokenizer.get_vocab()), default=1)


def position_limit(model: PreTrainedModel) -> int | None:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


def check_text_size(characters: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, field: str) -> None:
    """Refuse text of `characters` characters that cannot fit the model's positions, whatever its tokens."""
    limit, longest = position_limit(model), longest_token(tokenizer)
    if limit is not None and math.ceil(characters / longest) > limit:
        raise invalid_request(
            f"`{field}`: {characters} characters are at least {math.ceil(characters / longest)} tokens (no token of "
            f"this vocabulary is longer than {longest} characters), past the model's {limit} positions "
            "(max_position_embeddings); send a shorter prompt.",
            field,
        )


def message_characters(messages) -> int:
    """The characters of the text in chat `messages` (what the chat template adds only makes more tokens)."""
    total = 0
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        parts = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        total += sum(len(part if isinstance(part, str) else str(part.get("text") or "")) for part in parts if part)
    return total


def completion_prompts(
    prompt, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, use_cb: bool
) -> list[Prompt]:
    """`prompt` in each of the completions API's forms, as the prompts to answer, or an HTTP 400 naming it."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise invalid_request(f"`prompt` must be {FORMS}.", "prompt")
    for one in prompt:
        if isinstance(one, str):
            check_text_size(len(one), model, tokenizer, "prompt")
    return [_prompt(one, model, tokenizer, use_cb) for one in prompt]


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt(prompt, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, use_cb: bool) -> Prompt:
    if isinstance(prompt, str):
        ids, text = tokenizer(prompt)["input_ids"], prompt
    elif isinstance(prompt, list) and all(_is_token(token) for token in prompt):
        limit, vocabulary = position_limit(model), min(len(tokenizer), model.get_input_embeddings().num_embeddings)
        if limit is not None and len(prompt) > limit:
            raise invalid_request(
                f"`prompt`: {len(prompt)} token ids, past the model's {limit} positions (max_position_embeddings).",
                "prompt",
            )
        if any(not 0 <= token < vocabulary for token in prompt):
            raise invalid_request(f"`prompt`: token ids must be in [0, {vocabulary}).", "prompt")
        ids, text = list(prompt), tokenizer.decode(prompt)
    else:
        raise invalid_request(f"`prompt` must be {FORMS}.", "prompt")
    if use_cb:  # the continuous-batching manager takes a list
        return Prompt(ids, {"input_ids": ids}, text)
    input_ids = torch.tensor([ids], device=model.device)
    return Prompt(ids, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}, text)
