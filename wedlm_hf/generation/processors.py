"""Which logits processors WeDLM decoding can honour, and a clear error for the others.

Lossless mode (`verify.py`) hands every verified position's logits to the processors with exactly the input ids
`generate()` would hand them there, so it honours every processor that is a function of (input ids, scores) row by
row: prefix rules (n-gram bans, multi-token bad words and biases, `prefix_allowed_tokens_fn`), length rules (min
length, forced BOS/EOS, begin-suppress, exponential length penalty), warpers, watermarking and the caller's own
processors. It refuses only `LOSSLESS_REASONS`: processors that need a batch layout of their own or keep state
from one call to the next, which assumes one call per generated token.

The plain mode scores several mask slots from one forward, every slot with the same context: the row's committed
tokens (prompt + generated, left-padded to the batch's longest row). A processor is honoured there when its
effect does not depend on the exact prefix *before that slot* or on the current length:

* distribution warpers (temperature, top-k/p/h, min-p, typical, epsilon, eta), log-softmax renormalisation and
  inf/nan removal look at one slot's logits only;
* repetition penalties and always-suppressed tokens only need the set of tokens already seen (the committed
  ones; tokens filled earlier in the window are not yet part of it, a soft approximation);
* single-token sequence biases and bad words do not look at the prefix at all.

Processors keyed on the exact prefix (n-gram bans, multi-token bad words or biases, `prefix_allowed_tokens_fn`,
watermarks) or on the length (min length, forced BOS/EOS, exponential length penalty; the context is padded to the
longest row) would be silently wrong for every slot but the first, so `check_processors` rejects them there.
Classes defined outside transformers are the caller's own: they are applied with the committed context, as
documented in docs/ecosystem.md.
"""

import copy

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process as lp

HONOURED = (
    lp.TemperatureLogitsWarper,
    lp.TopKLogitsWarper,
    lp.TopPLogitsWarper,
    lp.TopHLogitsWarper,
    lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper,
    lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper,
    lp.RepetitionPenaltyLogitsProcessor,
    lp.EncoderRepetitionPenaltyLogitsProcessor,
    lp.SuppressTokensLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
    lp.LogitNormalization,
)

_LENGTH = "depends on the current length, which differs for every slot of a WeDLM window"
_PREFIX = "depends on the exact tokens before each slot, which WeDLM does not know until the window is committed"
REASONS: dict[type, tuple[str, str]] = {
    lp.MinLengthLogitsProcessor: (_LENGTH, "drop `min_length`"),
    lp.MinNewTokensLengthLogitsProcessor: (_LENGTH, "drop `min_new_tokens`"),
    lp.ExponentialDecayLengthPenalty: (_LENGTH, "drop `exponential_decay_length_penalty`"),
    lp.ForcedEOSTokenLogitsProcessor: (_LENGTH, "drop `forced_eos_token_id`"),
    lp.ForcedBOSTokenLogitsProcessor: (_LENGTH, "drop `forced_bos_token_id`; put BOS in the prompt"),
    lp.SuppressTokensAtBeginLogitsProcessor: (_LENGTH, "drop `begin_suppress_tokens`"),
    lp.NoRepeatNGramLogitsProcessor: (_PREFIX, "drop `no_repeat_ngram_size`, or use `repetition_penalty`"),
    lp.EncoderNoRepeatNGramLogitsProcessor: (_PREFIX, "drop `encoder_no_repeat_ngram_size`"),
    lp.PrefixConstrainedLogitsProcessor: (_PREFIX, "drop `prefix_allowed_tokens_fn`"),
    lp.WatermarkLogitsProcessor: (_PREFIX, "drop `watermarking_config`"),
    lp.SynthIDTextWatermarkLogitsProcessor: (_PREFIX, "drop `watermarking_config`"),
    lp.ClassifierFreeGuidanceLogitsProcessor: ("needs a doubled batch of conditional/unconditional rows", "drop `guidance_scale`"),
    lp.UnbatchedClassifierFreeGuidanceLogitsProcessor: (
        "runs its own autoregressive model calls on the unconditional prompt",
        "drop `guidance_scale` / `negative_prompt_ids`",
    ),
}


_STATEFUL = "keeps a per-row state from one call to the next, which assumes one call per generated token"
LOSSLESS_REASONS: dict[type, tuple[str, str]] = {
    lp.ClassifierFreeGuidanceLogitsProcessor: REASONS[lp.ClassifierFreeGuidanceLogitsProcessor],
    lp.UnbatchedClassifierFreeGuidanceLogitsProcessor: REASONS[lp.UnbatchedClassifierFreeGuidanceLogitsProcessor],
    lp.SynthIDTextWatermarkLogitsProcessor: (_STATEFUL, "drop `watermarking_config` or use a `WatermarkingConfig`"),
}
"""What lossless mode cannot honour: every other transformers processor acts on (input ids, scores) alone."""


def _multi_token_sequences(processor: lp.SequenceBiasLogitsProcessor) -> list[tuple[int, ...]]:
    return [tuple(sequence) for sequence in processor.sequence_bias if len(sequence) > 1]


def check_processors(logits_processor: LogitsProcessorList, lossless: bool = False) -> None:
    """Raise a ValueError naming the first processor WeDLM decoding cannot honour, and what to do instead."""
    for processor in logits_processor or ():
        name = type(processor).__name__
        if lossless:
            reason, fix = LOSSLESS_REASONS.get(type(processor), (None, None))
            known = isinstance(processor, (*HONOURED, *REASONS, lp.SequenceBiasLogitsProcessor))
            if reason is None and type(processor).__module__.startswith("transformers.") and not known:
                reason, fix = "is specific to another decoding scheme or model", "remove it"
            if reason is not None:
                raise ValueError(
                    f"Lossless WeDLM decoding cannot honour {name}: it {reason}. Either {fix}, or use `decoding='ar'`."
                )
            continue
        if isinstance(processor, lp.SequenceBiasLogitsProcessor):  # also NoBadWordsLogitsProcessor
            longer = _multi_token_sequences(processor)
            if not longer:
                continue
            argument = "bad_words_ids" if isinstance(processor, lp.NoBadWordsLogitsProcessor) else "sequence_bias"
            raise ValueError(
                f"WeDLM decoding cannot apply {name} to multi-token sequences {longer[:3]}: matching them "
                f"{_PREFIX}. Keep only single-token entries in `{argument}`, pass `wedlm_lossless=True` (which "
                "applies them exactly), or use `decoding='ar'`."
            )
        if isinstance(processor, HONOURED):
            continue
        reason, fix = REASONS.get(type(processor), (None, None))
        if reason is None:
            if not type(processor).__module__.startswith("transformers."):
                continue  # a user processor: applied with the committed tokens as context
            reason, fix = "is specific to another decoding scheme or model", "remove it"
        also = "" if type(processor) in LOSSLESS_REASONS else " pass `wedlm_lossless=True` (which applies it exactly),"
        raise ValueError(
            f"WeDLM decoding cannot honour {name}: it {reason}. Either {fix},{also} or use `decoding='ar'`."
        )


def split_suppressed(
    logits_processor: LogitsProcessorList, also: tuple[int, ...] = ()
) -> tuple[LogitsProcessorList, torch.Tensor | None]:
    """The list without its `SuppressTokensLogitsProcessor`s, and the ids they suppress plus `also` (None if none).

    Suppressing a token depends on nothing but the token, so the loop applies it to every forward's logits, every
    slot alike. That keeps lossless mode exact under `suppress_tokens` (greedy `generate()` suppresses the same
    ids before its argmax), which a fine-tuned model's generation config uses to keep the mask token out. Lossless
    sampling passes the mask id as `also`: it marks empty slots, so it is never drawn, which is exact when the model
    gives it no probability (WeDLM-trained checkpoints) and otherwise off by at most that probability per token.
    """
    kept, suppressed = LogitsProcessorList(), list(also)
    for processor in logits_processor or ():
        if type(processor) is lp.SuppressTokensLogitsProcessor:
            suppressed += processor.suppress_tokens.tolist()
        else:
            kept.append(processor)
    return kept, torch.tensor(sorted(set(suppressed)), dtype=torch.long) if suppressed else None


def for_rows(logits_processor: LogitsProcessorList, rows: torch.Tensor) -> LogitsProcessorList:
    """The processors for a stacked batch whose i-th row belongs to input row `rows[i]`: those holding per-row
    state of the call's batch (padding lengths, encoder prompts, `prefix_allowed_tokens_fn`'s batch id) are copied
    with that state picked for `rows`; the others are shared."""
    adapted = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, lp.PrefixConstrainedLogitsProcessor):
            allowed, index = processor._prefix_allowed_tokens_fn, rows.tolist()
            processor = lp.PrefixConstrainedLogitsProcessor(
                lambda batch_id, ids, allowed=allowed: allowed(index[batch_id], ids), processor._num_beams
            )
        elif isinstance(processor, lp.RepetitionPenaltyLogitsProcessor) and torch.is_tensor(
            processor.prompt_ignore_length
        ):
            processor = copy.copy(processor)
            ignored = processor.prompt_ignore_length
            processor.prompt_ignore_length = ignored[rows.to(ignored.device)]
        elif isinstance(processor, lp.EncoderRepetitionPenaltyLogitsProcessor):
            processor = copy.copy(processor)
            processor.encoder_input_ids = processor.encoder_input_ids[rows.to(processor.encoder_input_ids.device)]
        elif isinstance(processor, lp.EncoderNoRepeatNGramLogitsProcessor):
            processor = copy.copy(processor)
            processor.generated_ngrams = [processor.generated_ngrams[row] for row in rows.tolist()]
            processor.batch_size = len(processor.generated_ngrams)
        adapted.append(processor)
    return adapted
