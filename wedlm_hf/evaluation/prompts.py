"""Evaluation prompts: plain text or chat messages, each with a domain label, read from JSONL and tokenised.

A file's line is `{"prompt": "...", "domain": "..."}` or `{"messages": [{"role": ..., "content": ...}, ...]}`
(a chat, rendered with the tokenizer's chat template and its generation prompt). A bad line is an error naming the
file and line number, never skipped: a silently shorter prompt set would change the numbers without a trace.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from .jsonl import check_messages, read_objects

DEFAULT_DOMAIN = "default"
"""The domain of a prompt given without one."""


@dataclass(frozen=True)
class EvalPrompt:
    """One held-out prompt: `text` (continued as is) or `messages` (a chat), and the domain it is reported under."""

    text: str | None = None
    messages: tuple[dict, ...] | None = None
    domain: str = DEFAULT_DOMAIN

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise ValueError("an EvalPrompt needs exactly one of `text` and `messages`")

    def token_ids(self, tokenizer: PreTrainedTokenizerBase) -> list[int]:
        """The prompt's ids: the text tokenised, or the messages through the chat template with the generation
        prompt appended (the assistant's turn is what gets generated)."""
        if self.messages is None:
            ids = tokenizer(self.text)["input_ids"]
        elif tokenizer.chat_template is None:
            raise ValueError("a prompt has `messages` but the tokenizer has no chat template: give `prompt` text instead")
        else:
            ids = tokenizer.apply_chat_template(list(self.messages), add_generation_prompt=True, return_dict=True)[
                "input_ids"
            ]
        if not ids:
            raise ValueError(f"the prompt {self.text or self.messages!r} encodes to no tokens")
        return list(ids)


def as_prompts(prompts: Iterable["EvalPrompt | str"]) -> list[EvalPrompt]:
    """`EvalPrompt`s as given; a plain string is a text prompt of the default domain."""
    listed = [EvalPrompt(text=p) if isinstance(p, str) else p for p in prompts]
    if not listed:
        raise ValueError("no prompts given: evaluation needs at least one")
    return listed


def read_prompts(path: str | Path) -> list[EvalPrompt]:
    """The prompts of a JSONL file (see the module docstring); blank lines are allowed, anything else must parse."""
    prompts = [parse_record(record, where) for where, record in read_objects(path, EXAMPLE)]
    if not prompts:
        raise ValueError(f"prompts file {str(path)!r} has no prompts (one JSON object per line)")
    return prompts


EXAMPLE = '{"prompt": "...", "domain": "..."}'


def parse_record(record: dict, where: str) -> EvalPrompt:
    domain = record.get("domain", DEFAULT_DOMAIN)
    if not isinstance(domain, str) or not domain:
        raise ValueError(f"{where}: `domain` must be a non-empty string")
    has_text, has_messages = "prompt" in record, "messages" in record
    if has_text == has_messages:
        raise ValueError(f"{where}: give exactly one of `prompt` (text) and `messages` (a chat)")
    if has_text:
        if not isinstance(record["prompt"], str) or not record["prompt"]:
            raise ValueError(f"{where}: `prompt` must be a non-empty string")
        return EvalPrompt(text=record["prompt"], domain=domain)
    return EvalPrompt(messages=tuple(check_messages(record["messages"], where)), domain=domain)
