"""Log-probabilities for OpenAI's `logprobs`: each token's under the model given everything before it (the prompt
and the tokens before it), with the most likely alternatives, in the shapes of the completions and chat APIs.

They come from a forward of the model over the request's tokens, the prompt first, then the output as it is
delivered (fed through a cache, so each token is fed once), on a thread of its own beside the decoding. WeDLM
chooses tokens from window predictions that may still see mask tokens before them, and the continuous-batching
engine keeps no per-token distributions (`generate()`'s `output_scores` keeps a vocabulary-wide row per token),
so these are the model's left-to-right log-probabilities of the text, as an evaluation harness reads them: what
lossless greedy decoding's verifier chooses from, and raw (before temperature, penalties or logit_bias, as vLLM
reports by default).
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ..generation.transformers_version import CACHE_KEYWORD

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's chat limit, vLLM's default)."""
CHUNK = 256
"""Tokens per scoring forward: its logits are `CHUNK` x vocabulary floats, whatever the prompt's length."""
SCORING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wedlm-logprobs")
"""One scoring forward at a time, off the event loop."""


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float | None
    """None for the first prompt token, which nothing predicts."""
    top: list[tuple[int, float]]
    """The most likely tokens at its position, most likely first."""


class TokenScorer:
    """One request's tokens, fed in order (prompt, then output as it comes): `score` returns each new token's
    log-probability given all tokens fed before it."""

    def __init__(self, model: PreTrainedModel, top: int):
        self.model, self.top = model, top
        self.cache = DynamicCache(config=model.config)
        self.next_logprobs: torch.Tensor | None = None
        """Log-probabilities of the token after the last one fed (None before the first)."""

    async def score(self, token_ids: list[int]) -> list[TokenLogprob]:
        return await asyncio.get_running_loop().run_in_executor(SCORING, self._score, list(token_ids))

    @torch.no_grad()
    def _score(self, token_ids: list[int]) -> list[TokenLogprob]:
        scored = []
        for start in range(0, len(token_ids), CHUNK):
            chunk = token_ids[start : start + CHUNK]
            ids = torch.tensor([chunk], device=self.model.device)
            logits = self.model(input_ids=ids, use_cache=True, **{CACHE_KEYWORD: self.cache}).logits[0]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            if self.next_logprobs is None:  # the request's first token: nothing predicts it
                scored.append(TokenLogprob(chunk[0], None, []))
                predicted, predicting = chunk[1:], logprobs[:-1]
            else:
                predicted, predicting = chunk, torch.cat([self.next_logprobs[None], logprobs[:-1]])
            scored += [self._entry(token, row) for token, row in zip(predicted, predicting)]
            self.next_logprobs = logprobs[-1]
        return scored

    def _entry(self, token_id: int, logprobs: torch.Tensor) -> TokenLogprob:
        values, ids = logprobs.topk(self.top) if self.top else (logprobs[:0], logprobs[:0].long())
        return TokenLogprob(token_id, float(logprobs[token_id]), list(zip(ids.tolist(), values.tolist())))


class CompletionLogprobs:
    """The completions API's `logprobs` object for consecutive parts of one choice's text: `text_offset` counts on
    from the parts before."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer, self.offset = tokenizer, 0

    def part(self, scored: list[TokenLogprob]) -> dict:
        tokens, offsets = [], []
        for entry in scored:
            tokens.append(token_text(self.tokenizer, entry.token_id))
            offsets.append(self.offset)
            self.offset += len(tokens[-1])
        return {
            "tokens": tokens,
            "token_logprobs": [entry.logprob for entry in scored],
            "top_logprobs": [
                None if entry.logprob is None
                else {token_text(self.tokenizer, token): value for token, value in entry.top}
                for entry in scored
            ],
            "text_offset": offsets,
        }


def chat_logprobs(tokenizer: PreTrainedTokenizerBase, scored: list[TokenLogprob]) -> dict:
    """The chat API's `logprobs` object of `scored` output tokens."""

    def described(token_id: int, logprob: float) -> dict:
        text = token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**described(entry.token_id, entry.logprob), "top_logprobs": [described(*pair) for pair in entry.top]}
            for entry in scored
        ]
    }


def token_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    """A token as it reads in the output (special tokens, which the output text leaves out, read as nothing)."""
    return tokenizer.decode([token_id], skip_special_tokens=True)
