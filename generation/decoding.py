"""WeDLM streaming parallel decoding (spec §2) over a KV cache, batched, as a `custom_generate` callable.

Each step feeds one window per row: its filled slots first (in slot order), its mask slots last, each with its
logical RoPE position, right after the committed prefix in the cache. The leading filled slots are committed
from that same forward (their K/V stay in `WeDLMCache`), then low-entropy mask slots are filled. A row whose
commit ends it (EOS, a stopping criterion, or `max_new_tokens`) leaves the batch before the forward, so the last
forward of every row is one whose predictions are used.

The host reads the device once per step (`WindowDecoder._begin_step`): the next forward's shape and which rows
still run, which is all a loop with data-dependent shapes must know. Commits, fills and counters are dense masked
tensor ops over the batch; only streamers, user stopping criteria and logits processors/sampling (which read
tokens on the host by their nature) add reads.
"""

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.generation.streamers import BaseStreamer

from .attention import WindowAttention, flash_sequence_lengths, prebuilt_attention_mask, uses_flash_attention
from .cache import WeDLMCache
from .outputs import WeDLMGenerateOutput, WeDLMStats
from .processors import check_processors
from .selection import choose_slots, slot_entropy
from .settings import UNSET, WeDLMSettings
from .support import check_supported


class WindowDecoder:
    """Decoding state of one `generate` call: the active rows' windows, counters and the output buffer.

    A step reads the device once (`_begin_step`): the next forward's width, and which rows are still running.
    Everything else is dense, fixed-shape tensor work over the batch, so a GPU never waits on the host mid-step.
    """

    ROW_STATE = (
        "rows", "window", "window_length", "generated", "processed", "first_position", "window_fill_step", "done"
    )
    """Per-row tensors (first dimension: the running rows) that a finished row leaves."""
    COUNTERS = ("generated", "processed")
    """Running-row counters copied into `total_<name>` (one entry per input row) as their rows leave."""

    def __init__(
        self,
        model: PreTrainedModel,
        input_ids: torch.LongTensor,
        prompt_mask: torch.Tensor,
        settings: WeDLMSettings,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        streamer: BaseStreamer | None,
        prompt_padded: bool = True,
    ):
        batch_size, self.prompt_length = input_ids.shape
        device = input_ids.device
        self.model = model
        self.settings = settings
        self.mask_id = settings.mask_token_id
        self.width = 2 * settings.window_size  # a window plus the slots appended before a commit
        self.max_new_tokens = generation_config.max_length - self.prompt_length
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor
        self.user_criteria = [
            c for c in stopping_criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))
        ]
        self.streamer = streamer
        eos_ids = generation_config._eos_token_tensor
        self.eos_ids = eos_ids.to(device) if eos_ids is not None else None
        pad_id = generation_config._pad_token_tensor
        pad_id = int(pad_id) if pad_id is not None else (int(eos_ids.flatten()[0]) if eos_ids is not None else 0)
        self.keep_scores = bool(generation_config.output_scores)
        self.keep_logits = bool(generation_config.output_logits)

        # one column past the output: dense writes aim every slot they do not commit there
        self.discard = self.max_new_tokens
        self.sequences = torch.full(
            (batch_size, self.prompt_length + self.max_new_tokens + 1), pad_id, dtype=torch.long, device=device
        )
        self.sequences[:, : self.prompt_length] = input_ids
        self.pad_id = pad_id
        self.rows = torch.arange(batch_size, device=device)
        self.slots = torch.arange(self.width, device=device)[None]  # a row: broadcasts against (rows, slots)
        first_window = min(settings.window_size, self.max_new_tokens)
        self.window = torch.full((batch_size, self.width), self.mask_id, dtype=torch.long, device=device)
        self.window_length = torch.full((batch_size,), first_window, dtype=torch.long, device=device)
        self.generated = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.done = torch.zeros(batch_size, dtype=torch.bool, device=device)
        """Rows whose commit ended them (EOS, a stopping criterion, max_new_tokens); they leave at the next sync."""
        self.prompt_positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0)
        self.first_position = prompt_mask.long().sum(1)
        self.pending_prompt = input_ids  # fed together with the first window
        self.prompt_logits = None  # after that forward: the AR logits of each row's last prompt token
        self.cache = WeDLMCache(key_mask=prompt_mask)
        self.all_keys_valid = batch_size == 1 and not prompt_padded and not uses_flash_attention(model.config)
        """One unpadded row: every cached key stays valid, so a one-token forward needs no mask, as in AR decoding
        (then transformers' SDPA keeps grouped-query K/V grouped; its mask function checks, with one host read as in
        its own AR step, that no mask is needed)."""
        self.cache_commit = None
        """Per row, how many K/V of the last forward's window to keep; applied at the next step's sync."""
        vocab = model.config.get_text_config().vocab_size
        self.window_scores = self._score_buffer(batch_size, vocab, device) if self.keep_scores else None
        self.window_logits = self._score_buffer(batch_size, vocab, device) if self.keep_logits else None
        outputs = self.max_new_tokens + 1
        self.token_scores = self._score_buffer(batch_size, vocab, device, outputs) if self.keep_scores else None
        self.token_logits = self._score_buffer(batch_size, vocab, device, outputs) if self.keep_logits else None
        self.stats = WeDLMStats([], [], [])
        # per-row counters, kept on the device (no host sync per step) and copied into `stats` at the end
        self.processed = torch.zeros_like(self.generated)
        self.total_forwards, self.total_generated, self.total_processed = (
            torch.zeros(batch_size, dtype=torch.long, device=device) for _ in range(3)
        )
        self.window_fill_step = torch.zeros((batch_size, self.width), dtype=torch.long, device=device)
        self.fill_step = torch.zeros((batch_size, outputs), dtype=torch.long, device=device)
        self.commit_step = torch.zeros((batch_size, outputs), dtype=torch.long, device=device)

    def _score_buffer(self, batch_size: int, vocab: int, device, length: int | None = None) -> torch.Tensor:
        return torch.zeros(batch_size, length or self.width, vocab, device=device)

    def run(self) -> None:
        while True:
            num_leading = self._leading_filled()
            generated_before = self.generated
            self.done |= self._commit(num_leading)
            # grow the window by as many mask slots as it commits, within max_new_tokens
            budget = self.max_new_tokens - generated_before - self.window_length
            length = self.window_length + torch.minimum(num_leading, budget)
            step = self._begin_step(length, num_leading, generated_before)
            if step is None:
                return
            fed, keep, (length, num_leading, generated_before), _ = step
            logits, physical = self._feed(length, generated_before, fed, keep)
            self.cache_commit = num_leading
            slot_physical = self._shift(num_leading, length, physical)
            self._fill(logits, slot_physical, self.window[:, : self.settings.window_size] == self.mask_id)

    def _leading_filled(self) -> torch.Tensor:
        live = self.slots < self.window_length[:, None]
        filled = (self.window != self.mask_id) & live
        leading = filled.int().cumprod(1).sum(1)
        if self.settings.blockwise:  # the paper's baseline: a block commits only once it is completely filled
            leading = torch.where(leading == self.window_length, leading, torch.zeros_like(leading))
        return leading

    def _begin_step(
        self, length: torch.Tensor, *row_tensors: torch.Tensor, checks=()
    ) -> tuple[int, int, tuple[torch.Tensor, ...], list[int]] | None:
        """The step's one host sync. Reads the next forward's width (the longest running window), how many of its
        last columns hold mask slots, which rows still run, and the 0-dim `checks`; then keeps the last forward's
        committed K/V in the cache and drops finished rows (from the decoder and from `row_tensors`).

        Returns None when no row runs, else (width, mask columns, row_tensors, checks' values)."""
        running = ~self.done
        filled = ((self.window != self.mask_id) & (self.slots < length[:, None])).sum(1)
        committed = self.cache_commit if self.cache_commit is not None else torch.zeros_like(length)
        summary = torch.stack(
            [
                torch.where(running, length, 0).max(),
                torch.where(running, filled, self.width).min(),
                committed.max(),
                (self.cache.valid_per_row + committed).max(),
                *(check.long() for check in checks),
            ]
        )
        host = torch.cat([summary, running.long()]).tolist()
        fed, fewest_filled, kept, longest_valid = host[:4]
        if self.cache_commit is not None:
            self.cache.commit(committed, kept, longest_valid)
            self.cache_commit = None
        keep_rows = [row for row, alive in enumerate(host[4 + len(checks) :]) if alive]
        if len(keep_rows) < len(running):
            self._store_counters()
        if not keep_rows:
            return None
        row_tensors = (length, *row_tensors)
        if len(keep_rows) < len(running):
            index = torch.tensor(keep_rows, device=length.device)
            self._drop_rows(index)
            row_tensors = tuple(tensor[index] for tensor in row_tensors)
        return fed, fed - fewest_filled, row_tensors, host[4 : 4 + len(checks)]

    def _commit(self, num_leading: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Write up to `num_leading` window slots from `start` to the output, cut after the first EOS or stopping
        criterion; return which rows this commit ends (EOS, criterion or max_new_tokens). Ended rows commit nothing."""
        num_leading = num_leading.masked_fill(self.done, 0)
        finished = self.generated + num_leading >= self.max_new_tokens
        commit_length = num_leading
        if self.eos_ids is not None:
            in_commit = (self.slots >= start) & (self.slots < start + num_leading[:, None])
            is_eos = torch.isin(self.window, self.eos_ids) & in_commit
            has_eos = is_eos.any(1)
            commit_length = torch.where(has_eos, is_eos.int().argmax(1) + 1 - start, commit_length)
            finished |= has_eos
        if self.user_criteria:
            commit_length, stopped = self._apply_user_criteria(commit_length, start)
            finished |= stopped
        self._write(commit_length, start)
        return finished

    def _write(self, commit_length: torch.Tensor, start: int) -> None:
        """Copy each row's `commit_length` slots from `start` to the output, with their traces and scores."""
        offset = self.slots - start
        take = (offset >= 0) & (offset < commit_length[:, None])
        position = torch.where(take, self.generated[:, None] + offset, self.discard)  # index among generated tokens
        rows = self.rows[:, None]
        self.sequences[rows, self.prompt_length + position] = self.window
        self.fill_step[rows, position] = self.window_fill_step
        self.commit_step[rows, position] = self.stats.model_calls + 1
        for kept, store in ((self.window_scores, self.token_scores), (self.window_logits, self.token_logits)):
            if kept is not None:
                store[rows, position] = kept
        if self.streamer is not None:  # one put per token, as AR decoding does (consumers count puts)
            count, *tokens = torch.cat([commit_length[:1], self.window[0, start:]]).tolist()
            for token in tokens[:count]:
                self.streamer.put(torch.tensor([token]))
        self.generated = self.generated + commit_length  # a new tensor: callers keep the count before the commit

    def _apply_user_criteria(self, commit_length: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cut each row's commit at the first token after which a user stopping criterion fires, as AR would.

        A criterion may return a plain bool, as older ones (lm-evaluation-harness's stop sequences) do; transformers'
        `StoppingCriteriaList` accepts that too."""
        stopped = torch.zeros_like(commit_length, dtype=torch.bool)
        cut = commit_length.clone()
        for i, row in enumerate(self.rows.tolist()):
            committed = self.sequences[row, : self.prompt_length + int(self.generated[i])]
            for t in range(int(commit_length[i])):
                prefix = torch.cat([committed, self.window[i, start : start + t + 1]])[None]
                if any(bool(torch.as_tensor(criterion(prefix, None)).any()) for criterion in self.user_criteria):
                    cut[i], stopped[i] = t + 1, True
                    break
        return cut, stopped

    def _store_counters(self) -> None:
        """Copy the running rows' counters into the per-input-row totals (before rows leave)."""
        for name in self.COUNTERS:
            getattr(self, f"total_{name}")[self.rows] = getattr(self, name)
        self.total_forwards[self.rows] = self.stats.model_calls  # every row runs from the first forward

    def _drop_rows(self, index: torch.Tensor) -> None:
        for name in self.ROW_STATE + ("window_scores", "window_logits"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name)[index])
        if self.pending_prompt is not None:
            self.pending_prompt = self.pending_prompt[index]
            self.prompt_positions = self.prompt_positions[index]
        self.cache.select_rows(index)

    def _feed(
        self, length: torch.Tensor, generated_before: torch.Tensor, fed: int, keep: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over each row's first `length` slots (`fed` columns: the longest): filled slots first, mask
        slots last, dead slots (rows shorter than the longest) at the end; RoPE keeps each slot's logical position.

        Returns the logits of the last `keep` columns and each slot's index into them (negative: no logits). Only
        mask slots need logits, and they sit physically last, so the lm_head can skip the leading columns that
        are filled in every row."""
        live = self.slots < length[:, None]
        filled = (self.window != self.mask_id) & live
        order_key = torch.where(
            filled, self.slots, torch.where(live, self.width + self.slots, 2 * self.width + self.slots)
        )
        order = order_key.argsort(dim=1)
        fed_order = order[:, :fed]
        input_ids = self.window.gather(1, fed_order)
        position_ids = (self.first_position + generated_before)[:, None] + fed_order
        fed_live = self.slots[:, :fed] < length[:, None]
        prompt_pending = self.pending_prompt is not None
        if prompt_pending:
            input_ids = torch.cat([self.pending_prompt, input_ids], dim=1)
            position_ids = torch.cat([self.prompt_positions, position_ids], dim=1)
            self.pending_prompt = None
        # with the prompt, one more column: the last prompt token's logits, the AR prediction of the first new token
        logits = self._forward(input_ids, position_ids, fed_live, logits_to_keep=keep + int(prompt_pending))
        self.prompt_logits = logits[:, 0] if prompt_pending else None
        self.stats.model_calls += 1
        self.processed = self.processed + length
        return logits[:, logits.shape[1] - keep :], order.argsort(dim=1) - (fed - keep)

    def _forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, window_live: torch.Tensor, logits_to_keep: int
    ) -> torch.Tensor:
        """The model's forward over the fed columns (`window_live`: the live window slots among them), under the
        step's prebuilt mask; returns the logits of the last `logits_to_keep` columns."""
        past_length = self.cache.get_seq_length()
        attention_mask = None
        if input_ids.shape[1] > 1 or not self.all_keys_valid:
            attention_mask = prebuilt_attention_mask(
                self.model.config, self.cache.key_valid(window_live), input_ids.shape[1], self.model.dtype
            )
        with WindowAttention(self.model):
            return self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **flash_sequence_lengths(
                    self.model.config, input_ids.shape[0], input_ids.shape[1], past_length, input_ids.device
                ),
            ).logits

    def _shift(self, shift: torch.Tensor, length: torch.Tensor, physical: torch.Tensor) -> torch.Tensor:
        """Drop each row's first `shift` slots; return where this forward's logits of each remaining slot are."""
        source = (self.slots + shift[:, None]).clamp(max=self.width - 1)
        in_window = self.slots < (length - shift)[:, None]
        self.window = torch.where(in_window, self.window.gather(1, source), self.mask_id)
        self.window_length = length - shift
        self.window_fill_step = self.window_fill_step.gather(1, source)
        for name in ("window_scores", "window_logits"):
            kept = getattr(self, name)
            if kept is not None:
                setattr(self, name, kept.gather(1, source[..., None].expand(-1, -1, kept.shape[-1])))
        return physical.gather(1, source[:, : self.settings.window_size])

    def _fill(self, logits: torch.Tensor, slot_physical: torch.Tensor, fillable: torch.Tensor) -> None:
        """Fill the confident slots among the live, `fillable` ones of the first `window_size` slots.

        Entropy and the greedy argmax run once per logits column, dense; the slots then gather them. The
        forward's logits are this step's own: the mask column is cleared in place (the mask id is never a
        prediction, it would fill nothing) once the entropy, which includes it, is taken."""
        if logits.shape[1] == 0:  # every fed slot was filled: nothing to predict
            return
        window_size = self.settings.window_size
        candidates = fillable & (self.slots[:, :window_size] < self.window_length[:, None])
        columns = slot_physical.clamp(0, logits.shape[1] - 1)
        entropy = slot_entropy(logits).gather(1, columns)
        chosen = choose_slots(entropy, candidates, self.settings.entropy_threshold, self.settings.pos_penalty_factor)
        slot_logits = self._gather_columns(logits, columns) if self.keep_logits else None
        logits[..., self.mask_id] = float("-inf")
        if self.logits_processor or self.do_sample:
            tokens, slot_scores = self._choose_processed(logits, columns, chosen)
        else:
            tokens = logits.argmax(-1).gather(1, columns)
            slot_scores = self._gather_columns(logits, columns) if self.keep_scores else None
        window = self.window[:, :window_size]  # a view: the fills land in `self.window`
        window.copy_(torch.where(chosen, tokens, window))
        self.window_fill_step[:, :window_size].masked_fill_(chosen, self.stats.model_calls)
        for kept, values in ((self.window_scores, slot_scores), (self.window_logits, slot_logits)):
            if kept is not None:
                kept[:, :window_size] = torch.where(chosen[..., None], values.to(kept.dtype), kept[:, :window_size])

    @staticmethod
    def _gather_columns(logits: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        return logits.gather(1, columns[..., None].expand(-1, -1, logits.shape[-1]))

    def _choose_processed(
        self, logits: torch.Tensor, columns: torch.Tensor, chosen: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens (and scores) of the chosen slots through the logits processors/warpers, with each slot's row's
        committed tokens as context, then argmax or a sample. Processors read that context on the host, so this
        path indexes the chosen slots only: vocabulary-wide processor work scales with the slots filled."""
        rows, slots = chosen.nonzero(as_tuple=True)
        scores = logits[rows, columns[rows, slots]]
        if self.logits_processor:
            scores = self.logits_processor(self._committed_context()[rows], scores.float())
        if self.do_sample:
            picked = torch.multinomial(torch.softmax(scores.float(), dim=-1), 1).squeeze(1)
        else:
            picked = scores.argmax(-1)
        tokens = torch.full_like(columns, self.mask_id)
        tokens[rows, slots] = picked
        slot_scores = None
        if self.keep_scores:
            slot_scores = torch.zeros(*columns.shape, logits.shape[-1], dtype=scores.dtype, device=scores.device)
            slot_scores[rows, slots] = scores
        return tokens, slot_scores

    def _committed_context(self) -> torch.LongTensor:
        """Left-padded (rows, prompt + committed) ids: every row's context ends at its last committed token."""
        total = self.prompt_length + int(self.generated.max())
        ends = self.prompt_length + self.generated
        columns = torch.arange(total, device=self.window.device)[None, :] + (ends[:, None] - total)
        context = self.sequences[self.rows[:, None], columns.clamp(min=0)]
        return context.masked_fill(columns < 0, self.pad_id)

    def finish_stats(self) -> WeDLMStats:
        """Copy the counters into `stats`, with each row's per-token trace: the forward that filled each token and
        the one that committed it."""
        self.stats.forwards = self.total_forwards.tolist()
        self.stats.generated = self.total_generated.tolist()
        self.stats.processed = self.total_processed.tolist()
        for row, count in enumerate(self.stats.generated):
            self.stats.fill_steps.append(self.fill_step[row, :count].tolist())
            self.stats.commit_steps.append(self.commit_step[row, :count].tolist())
        return self.stats

    def sequences_out(self) -> torch.LongTensor:
        longest = int(self.total_generated.max())
        return self.sequences[:, : self.prompt_length + longest]

    def per_token(self, store: torch.Tensor | None) -> tuple[torch.Tensor, ...] | None:
        if store is None:
            return None
        longest = int(self.total_generated.max())
        return tuple(store[:, t] for t in range(longest))


def _prompt_mask(input_ids: torch.LongTensor, model_kwargs: dict) -> tuple[torch.Tensor, list[int]]:
    """The prompt's 2D padding mask, checked (WeDLM needs left padding and at least one real token per row), and
    each row's prompt length."""
    if input_ids.shape[1] == 0:
        raise ValueError("`input_ids` is empty: WeDLM decoding needs at least one prompt token (e.g. the BOS token).")
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        return torch.ones_like(input_ids), [input_ids.shape[1]] * input_ids.shape[0]
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"`attention_mask` must have the shape of `input_ids` {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}."
        )
    lengths = attention_mask.sum(1).tolist()
    empty_rows = [row for row, length in enumerate(lengths) if length == 0]
    if empty_rows:
        raise ValueError(f"Rows {empty_rows} of `attention_mask` are all padding: every row needs a prompt token.")
    if bool((attention_mask[:, 1:] < attention_mask[:, :-1]).any()):
        raise ValueError(
            "`attention_mask` has padding after a prompt token (right padding). WeDLM decoding, like every "
            "decoder-only generation, needs left padding: set `tokenizer.padding_side = 'left'`."
        )
    return attention_mask, lengths


class UnsupportedRequest(ValueError):
    """A `generate` option that WeDLM decoding cannot honour (transformers' usual decoding may)."""


def reject_unsupported(generation_config: GenerationConfig, options: dict | None = None) -> None:
    """Refuse the generation options that WeDLM decoding would otherwise ignore; `options` (the call's keywords)
    override the generation config's attributes."""

    def given(name: str):
        return (options or {}).get(name, getattr(generation_config, name, None))

    num_beams = given("num_beams")
    if num_beams is not None and num_beams > 1:
        raise UnsupportedRequest(f"WeDLM decoding is not beam search: got num_beams={num_beams}; use num_beams=1.")
    if given("prompt_lookup_num_tokens") is not None:
        raise UnsupportedRequest(
            "`prompt_lookup_num_tokens` selects prompt-lookup decoding, which WeDLM decoding does not combine with "
            "(its window already drafts several tokens per forward); drop it."
        )
    for name in ("output_hidden_states", "output_attentions"):
        if given(name):
            raise UnsupportedRequest(
                f"`{name}=True`: WeDLM forwards see reordered windows of slots, not one new position per step, so "
                f"there are no per-token {name[7:]} to return; run `model(output.sequences, {name}=True)` on the "
                "generated sequences instead."
            )
    if given("cache_implementation") not in (None, "static"):
        raise UnsupportedRequest(
            f"`cache_implementation={given('cache_implementation')!r}`: WeDLM decoding builds its own cache "
            "(`WeDLMCache`, which crops what a window forward wrote, or with `cache_implementation='static'` the "
            "fixed-shape `WindowStaticCache`); drop `cache_implementation` (pass `cache_implementation=None` where "
            "the generation config sets it) or pass 'static'."
        )
    if given("use_cache") is False:
        raise UnsupportedRequest(
            "`use_cache=False`: WeDLM decoding needs the KV cache (committed tokens are never recomputed); drop "
            "`use_cache=False`."
        )


MODE_OPTIONS = {
    GenerationMode.CONTRASTIVE_SEARCH: "`penalty_alpha`",
    GenerationMode.DOLA_GENERATION: "`dola_layers`",
    GenerationMode.CONSTRAINED_BEAM_SEARCH: "`constraints` / `force_words_ids`",
}
"""The options that select a generation mode other than greedy or sampling, for the error message."""


def reject_other_modes(generation_config: GenerationConfig) -> None:
    """WeDLM replaces greedy search and sampling; options selecting another mode would be silently dropped."""
    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        raise UnsupportedRequest(
            f"{MODE_OPTIONS.get(mode, 'the generation options')} select {mode.value.replace('_', ' ')}, which WeDLM "
            "decoding does not do; drop them."
        )


def _validate_request(model: PreTrainedModel, generation_config: GenerationConfig, model_kwargs, synced_gpus) -> None:
    check_supported(model)
    reject_unsupported(generation_config)
    reject_other_modes(generation_config)
    if model_kwargs.get("inputs_embeds") is not None:
        raise UnsupportedRequest(
            "WeDLM decoding needs `input_ids` (mask slots are token ids); `inputs_embeds` is not supported."
        )
    if synced_gpus:
        raise UnsupportedRequest("WeDLM decoding does not support `synced_gpus=True`.")
    cache = model_kwargs.get("cache")
    if cache is not None and cache.get_seq_length() > 0:
        raise UnsupportedRequest(
            "WeDLM decoding builds its own cache; a filled `cache` / `past_key_values` from an earlier call cannot be "
            "continued. Pass the full sequence as `input_ids` instead."
        )


def _validate_special_tokens(settings: WeDLMSettings, generation_config: GenerationConfig) -> None:
    """The mask id marks empty slots, so it must differ from every id the output can end or be padded with."""
    eos = generation_config._eos_token_tensor
    if eos is not None and settings.mask_token_id in eos.flatten().tolist():
        raise ValueError(
            f"`mask_token_id` ({settings.mask_token_id}) is also an `eos_token_id`: a slot holding it would be both "
            "empty and final. Use the checkpoint's dedicated mask token."
        )
    pad = generation_config._pad_token_tensor
    if pad is not None and int(pad) == settings.mask_token_id:
        raise ValueError(
            f"`mask_token_id` ({settings.mask_token_id}) equals `pad_token_id`: finished rows would look like empty "
            "slots. Set a different `pad_token_id`."
        )


def _check_positions(model: PreTrainedModel, longest: int, max_new_tokens: int) -> None:
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"A prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
            f"max_position_embeddings ({limit}); shorten the prompt or lower `max_new_tokens`."
        )


@torch.no_grad()
def wedlm_decode(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer: BaseStreamer | None = None,
    wedlm_window_size=UNSET,
    wedlm_entropy_threshold=UNSET,
    wedlm_pos_penalty_factor=UNSET,
    mask_token_id=UNSET,
    wedlm_blockwise=UNSET,
    wedlm_lossless=UNSET,
    wedlm_draft_schedule=UNSET,
    wedlm_static=UNSET,
    **model_kwargs,
) -> WeDLMGenerateOutput | torch.LongTensor:
    """WeDLM decoding loop; use as `model.generate(custom_generate=wedlm_decode, mask_token_id=..., ...)`.

    Takes the `wedlm_*` keywords (window size, entropy threshold, distance penalty, `wedlm_lossless` for output
    identical to greedy AR and `wedlm_draft_schedule` for its drafts, `wedlm_blockwise` for the paper's baseline,
    `wedlm_static` for fixed shapes that `torch.compile` captures once) and `mask_token_id`, else the generation
    config's attributes of those names, else the defaults of `WeDLMSettings`. Prefer `generate(decoding="wedlm")`
    (via `enable`): transformers 5.x hands a callable neither the streamer nor the tokenizer `stop_strings` need.
    """
    _validate_request(model, generation_config, model_kwargs, synced_gpus)
    check_processors(logits_processor)
    settings = WeDLMSettings.resolve(
        generation_config,
        model.config,
        model.config.get_text_config().vocab_size,
        window_size=wedlm_window_size,
        entropy_threshold=wedlm_entropy_threshold,
        pos_penalty_factor=wedlm_pos_penalty_factor,
        mask_token_id=mask_token_id,
        blockwise=wedlm_blockwise,
        lossless=wedlm_lossless,
        draft_schedule=wedlm_draft_schedule,
        static=wedlm_static,
    )
    _validate_special_tokens(settings, generation_config)
    prompt_mask, prompt_lengths = _prompt_mask(input_ids, model_kwargs)
    _check_positions(model, max(prompt_lengths), generation_config.max_length - input_ids.shape[1])
    decoder_class = WindowDecoder
    if settings.lossless:
        from .lossless import LosslessDecoder  # the lossless decoder builds on this module

        decoder_class = LosslessDecoder
    if settings.static:
        from .static import static_decoder  # builds on both decoders

        decoder_class = static_decoder(decoder_class)
    decoder = decoder_class(
        model,
        input_ids,
        prompt_mask,
        settings,
        generation_config,
        logits_processor,
        stopping_criteria,
        streamer,
        prompt_padded=min(prompt_lengths) < input_ids.shape[1],
    )
    if decoder.max_new_tokens > 0:
        decoder.run()
    if streamer is not None:
        streamer.end()
    sequences = decoder.sequences_out()
    if not generation_config.return_dict_in_generate:
        return sequences
    return WeDLMGenerateOutput(
        sequences=sequences,
        scores=decoder.per_token(decoder.token_scores),
        logits=decoder.per_token(decoder.token_logits),
        wedlm_stats=decoder.finish_stats(),
    )
