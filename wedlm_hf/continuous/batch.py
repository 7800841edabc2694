"""The running batch of continuous batching: the decode loop every running request's row is part of, its K/V
pool, and the decoding set-up all rows share (one generation config: logits processors, EOS, the WeDLM settings),
built by `prepare_decoding` as `wedlm_decode` builds its own. Sampling is each row's own (`RowSampling` on the
output record: temperature, top-k/p, min-p, penalties, seed), the config's sampling being the default of a
request that brings none.

It knows rows, not requests (`RunningRequests`, running.py, maps one to the other): an admitted group is decoded
through its first step (prompt and first window) in a batch of its own, as `generate` decodes it, then joins
(`DecodeLoop.join`); the first group into an idle batch becomes the loop, and the loop is dropped once its last
row is forgotten, so the batch only ever holds rows that decode.

The K/V of the running rows live in a pool of fixed-size blocks (generation/pool.py, kv_blocks.py): a row holds
blocks for the positions it has reached, a joining row's K/V are copied into free blocks and nothing else moves,
and a row that ends hands its blocks back without moving any K/V, so no admission or exit copies the running
rows' cache, every forward feeds the running rows alone, and the pool's size follows the tokens the rows hold,
not their budgets or the position limit. Without the pool (`kv_pool=False`, or an attention implementation that
takes no 4D mask, such as FlashAttention) the rows share one growing cache, which every admission concatenates
and every exit index-selects.
"""

import copy

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase, StoppingCriteriaList
from transformers import StopStringCriteria

from ..generation.attention import MASK_IMPLEMENTATIONS
from ..generation.decoding import prepare_decoding, start_decoding
from ..generation.loop import DecodeLoop, RowProgress, first_step
from ..generation.pool import PoolBackend
from ..generation.sampling import RowSampling, SamplingParams
from ..generation.window import InputRow
from .history import RequestHistory
from .padding import left_padded
from .sequence import Sequence


class RunningBatch:
    def __init__(
        self,
        model: PreTrainedModel,
        generation_config: GenerationConfig | None,
        max_sequence_length: int | None,
        tokenizer: PreTrainedTokenizerBase | None,
        max_batch_size: int,
        kv_pool: bool | None = None,
        history: RequestHistory | None = None,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = copy.deepcopy(generation_config or model.generation_config)
        self.default_sampling = shared_sampling(config)
        self.device = device = model.device
        self.setup = setup = prepare_decoding(model, config, device=device)
        self.settings, self.layout, self.pad_id = setup.settings, setup.layout, setup.pad_id
        self.history = history
        if history is not None and not self.settings.lossless:
            raise ValueError(
                "`draft_history` drafts from earlier requests for lossless decoding to verify; turn lossless on "
                "(`wedlm_lossless=True`, serve's --lossless) or drop it."
            )
        if self.settings.static:
            raise ValueError("`wedlm_static=True` preallocates a fixed batch, so requests cannot join it; drop it.")
        if config.output_scores or config.output_logits:
            raise ValueError("Continuous batching returns tokens and statistics, not scores or logits; drop them.")
        limit = max_sequence_length or getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if not limit:
            raise ValueError("The model declares no max_position_embeddings: pass `max_sequence_length=`.")
        self.max_sequence_length = int(limit)
        self.pool = self._pool(kv_pool, max_batch_size)
        self.loop: DecodeLoop | None = None
        """The rows decoding together; None while there are none."""

    @property
    def rows(self) -> int:
        """Rows held: decoding, or ended and not yet forgotten."""
        return 0 if self.loop is None else self.loop.record.sequences.shape[0]

    def _pool(self, kv_pool: bool | None, rows: int) -> PoolBackend | None:
        """The K/V pool (`kv_pool` None: wherever the attention takes the pool's 4D mask), or None."""
        implementation = self.model.config._attn_implementation
        if kv_pool is None:
            kv_pool = implementation in MASK_IMPLEMENTATIONS
        elif kv_pool and implementation not in MASK_IMPLEMENTATIONS:
            raise ValueError(
                f"`kv_pool=True` feeds a 4D attention mask, which attn_implementation={implementation!r} does not "
                "take; load the model with attn_implementation='sdpa' (or 'eager'), or pass kv_pool=False."
            )
        if not kv_pool:
            return None
        return PoolBackend(self.model, rows, self.layout.mask_id)

    def start(self, group: list[Sequence]) -> None:
        """Decode the first step of `group` in a batch of its own (prompt and first window in one forward, as
        `generate` does), then append its rows, in order, after the held ones. A fault anywhere in here leaves
        the held rows as they were."""
        input_ids, mask = left_padded([sequence.prompt_ids for sequence in group], self.pad_id, self.device)
        budgets = [sequence.max_new_tokens for sequence in group]
        record = self.setup.output_record(input_ids, budgets, self.config, StoppingCriteriaList())
        record.row_criteria = {
            i: list(StoppingCriteriaList([StopStringCriteria(self.tokenizer, sequence.stop_strings)]))
            for i, sequence in enumerate(group) if sequence.stop_strings
        }
        params = [sequence.sampling for sequence in group]
        record.sampling = RowSampling.for_requests(params, self.device, self.layout.mask_id)
        padded = any(len(sequence.prompt_ids) < input_ids.shape[1] for sequence in group)
        loop = start_decoding(
            self.model, input_ids, mask, padded, torch.tensor(budgets, device=self.device), self.setup, self.config,
            record, self.history, beside=0 if self.loop is None else self.loop.running,
        )
        first_step(loop)
        if self.loop is not None:
            self.loop.join(loop)
            return
        if self.pool is not None:
            loop.rows.hand_over(self.pool)
        self.loop = loop

    def step(self) -> None:
        """One forward of the decoding rows, settled (rows it ended leave the loop, to be reported)."""
        if self.loop is not None and self.loop.running:
            self.loop.advance()
            self.loop.settle()

    def progress(self, reported: list[int]) -> list[RowProgress]:
        """Each held row's new tokens after the first `reported[row]`, its finish reason and, once ended, stats."""
        return [] if self.loop is None else self.loop.progress(reported)

    def blocks(self, row: InputRow) -> list[int]:
        """The pool's list of the blocks input row `row` holds (it grows in place); empty without a pool or once the
        row ended."""
        running = None if self.loop is None or self.pool is None else self.loop.rows.running_row(row)
        return [] if running is None else self.pool.cache.blocks.held[running]

    def cancel(self, rows: list[InputRow]) -> None:
        self.loop.rows.cancel(rows)

    def forget(self, rows: list[InputRow]) -> None:
        """Drop ended rows `rows` (reported): the later rows move up; with none left, the loop goes."""
        self.loop.rows.forget(rows)
        if self.rows == 0:
            self.loop = None

    def clear(self) -> None:
        """Drop every row (after a fault in a shared step, whose state cannot be trusted); the pool's blocks are free."""
        self.loop = None
        if self.pool is not None:
            self.pool.select_rows(torch.zeros(0, dtype=torch.long, device=self.device), [])


UNSUPPORTED_SAMPLING = ("typical_p", "epsilon_cutoff", "eta_cutoff", "top_h")
"""Warpers a row cannot have its own of: a sampling server config with one is refused."""


def shared_sampling(config: GenerationConfig) -> SamplingParams:
    """The sampling `config` asks for, as the default of requests that bring none; `config` (the batch's own copy)
    is left greedy and unpenalised, since each row samples and penalises by its own settings."""
    if config.do_sample:
        unsupported = [name for name in UNSUPPORTED_SAMPLING if getattr(config, name, None) not in (None, 0, 1.0)]
        if unsupported:
            raise ValueError(
                f"Continuous batching samples with temperature, top_k, top_p, min_p and penalties per request; the "
                f"generation config also sets {', '.join(unsupported)}: drop it, or decode without continuous batching."
            )
    sampling = SamplingParams.from_generation_config(config)
    config.do_sample = False
    config.temperature = config.top_k = config.top_p = config.min_p = config.repetition_penalty = None
    longer = {key: value for key, value in (config.sequence_bias or {}).items() if len(key) > 1}
    config.sequence_bias = longer or None  # the single-token ones are each row's logit bias
    return sampling
