"""WeDLM streaming parallel decoding (spec §2) over a KV cache, batched, as a `custom_generate` callable.

Each step feeds one window per row: its filled slots first (in slot order), its mask slots last, each with its
logical RoPE position, right after the committed prefix in the cache. The leading filled slots are committed
from that same forward (their K/V stay in the cache), then low-entropy mask slots are filled. A row whose commit
ends it (EOS, a stopping criterion, or `max_new_tokens`) leaves the batch before the forward, so the last forward
of every row is one whose predictions are used.

`wedlm_decode` validates the request, resolves the settings, picks a step policy (plain.py, lossless.py) and a
forward backend (dynamic.py; with `wedlm_static`, a pool of fixed shapes after the prompt's step: pool.py), runs
the loop (loop.py: one host read per step) and returns the record's output. docs/architecture.md maps the modules.
"""

from dataclasses import dataclass, replace

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.utils import logging

from .attention import MASK_IMPLEMENTATIONS
from .cost_profile import chosen_cost
from .dynamic import DynamicBackend
from .fill import SlotFiller
from .lossless import LosslessPolicy
from .options import KEYWORDS
from .lookup import PromptLookup, TokenHistory
from .loop import DecodeLoop, run
from .outputs import WeDLMGenerateOutput, usable_outside_inference_mode
from .plain import PlainPolicy, warn_if_window_does_not_pay
from .pool import PoolBackend, compiles
from .processors import split_suppressed
from .record import OutputRecord
from .sampling import RowSampling
from .settings import UNSET, WeDLMSettings
from .support import is_wedlm_trained
from .validation import check_request, check_settings, checked_prompt
from .verify import Verifier
from .window import WindowLayout, WindowScores, WindowState

logger = logging.get_logger(__name__)


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
    wedlm_forward_scale=UNSET,
    wedlm_static=UNSET,
    wedlm_prompt_lookup=UNSET,
    wedlm_prompt_lookup_ngram=UNSET,
    wedlm_prompt_lookup_min_ngram=UNSET,
    wedlm_prompt_lookup_tokens=UNSET,
    wedlm_prompt_lookup_matches=UNSET,
    **model_kwargs,
) -> WeDLMGenerateOutput | torch.LongTensor:
    """WeDLM decoding loop; use as `model.generate(custom_generate=wedlm_decode, mask_token_id=..., ...)`.

    Takes the `wedlm_*` keywords of options.py (`wedlm_lossless` for output identical to greedy AR, with its drafts
    and prompt lookup; `wedlm_blockwise`, the paper's baseline; `wedlm_static`, fixed shapes) and `mask_token_id`,
    else the generation config's attributes of those names, else `WeDLMSettings`' defaults. Prefer
    `generate(decoding="wedlm")` (via `enable`): transformers 5.x hands a callable neither streamer nor tokenizer.
    """
    keywords = {name: value for name, value in locals().items() if name in KEYWORDS}  # (the options table's)
    with torch.inference_mode():  # no autograd bookkeeping per op: ~8% of a CPU decode of the embedded model
        setup = prepare_decoding(
            model, generation_config, logits_processor, model_kwargs, synced_gpus, input_ids.device, **keywords
        )
        max_new_tokens = generation_config.max_length - input_ids.shape[1]
        mask, prompt_lengths = checked_prompt(model, input_ids, model_kwargs, max_new_tokens)
        kinds = tuple(kind for kind in ("scores", "logits") if getattr(generation_config, f"output_{kind}"))
        record = setup.output_record(
            input_ids, [max_new_tokens] * input_ids.shape[0], generation_config, stopping_criteria, streamer, kinds
        )
        budgets = torch.full((input_ids.shape[0],), max_new_tokens, dtype=torch.long, device=input_ids.device)
        loop = start_decoding(
            model, input_ids, mask, min(prompt_lengths) < input_ids.shape[1], budgets, setup, generation_config, record
        )
        if max_new_tokens > 0:
            static = setup.settings.static
            pool = static_backend(model, input_ids, generation_config, setup.layout, max_new_tokens) if static else None
            run(loop, pool)
        if streamer is not None:
            streamer.end()
        output = record.output(generation_config.return_dict_in_generate)
    return usable_outside_inference_mode(output)


@dataclass
class DecodingSetup:
    """What every row of one decode shares, built once by `prepare_decoding`: the resolved settings, the processors
    the loop runs, the window layout, the pad id, the vocabulary size."""

    settings: WeDLMSettings
    processors: LogitsProcessorList
    layout: WindowLayout
    pad_id: int
    vocab_size: int

    def output_record(
        self,
        input_ids: torch.LongTensor,
        budgets: list[int],
        generation_config: GenerationConfig,
        stopping_criteria: StoppingCriteriaList,
        streamer: BaseStreamer | None = None,
        kinds: tuple[str, ...] = (),
    ) -> OutputRecord:
        """The output record of `input_ids`, each row's output as wide as its budget needs, finished rows padded
        with `pad_id`."""
        eos_ids = generation_config._eos_token_tensor
        eos_ids = eos_ids.to(input_ids.device) if eos_ids is not None else None
        policy = LosslessPolicy if self.settings.lossless else PlainPolicy
        return OutputRecord(
            input_ids, self.layout, budgets, self.pad_id, eos_ids, stopping_criteria, streamer, kinds,
            self.vocab_size, policy.counter_names,
        )


def prepare_decoding(
    model: PreTrainedModel,
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList | None = None,
    model_kwargs: dict | None = None,
    synced_gpus: bool = False,
    device: torch.device | str | None = None,
    **wedlm_keywords,
) -> DecodingSetup:
    """One decode's set-up, for `wedlm_decode` and continuous batching alike: the request checked, the settings
    resolved (`wedlm_keywords`, else the generation config, else defaults) and checked, the processors split from
    the ids every forward suppresses, the window layout on `device`, the cost model chosen for the model's
    device (`cost_profile.py`).

    `logits_processor` None means a caller outside `generate()`: the config's special tokens and processors are
    then prepared (in place) as `generate()` prepares them."""
    if logits_processor is None:
        # transformers has no public API that prepares a generation config's special tokens or builds its logits
        # processors outside `generate()`; these two private helpers are the only way, and are called here alone
        model._prepare_special_tokens(generation_config, kwargs_has_attention_mask=True, device=device)
        logits_processor = model._get_logits_processor(generation_config, device=device, model_kwargs={})
    check_request(model, generation_config, model_kwargs or {}, synced_gpus)
    vocab_size = model.config.get_text_config().vocab_size
    settings = WeDLMSettings.resolve(generation_config, model.config, vocab_size, **wedlm_keywords)
    settings = replace(settings, forward_scale=chosen_cost(model, settings.forward_scale)[0])
    processors, suppressed = window_processors(settings, generation_config, logits_processor)
    check_settings(settings, model, generation_config, processors)
    layout = WindowLayout.create(settings.mask_token_id, settings.window_size, device, suppressed)
    return DecodingSetup(settings, processors, layout, pad_token_id(generation_config), vocab_size)


def window_processors(
    settings: WeDLMSettings, generation_config: GenerationConfig, logits_processor: LogitsProcessorList
) -> tuple[LogitsProcessorList, torch.Tensor | None]:
    """The processors the loop runs, and the ids every forward suppresses (`split_suppressed`): the mask id marks
    empty slots, so lossless sampling never draws it."""
    never = (settings.mask_token_id,) if settings.lossless and generation_config.do_sample else ()
    return split_suppressed(logits_processor, never)


def start_decoding(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    mask: torch.Tensor,
    prompt_padded: bool,
    max_new_tokens: torch.Tensor,
    setup: DecodingSetup,
    generation_config: GenerationConfig,
    record: OutputRecord,
    history: TokenHistory | None = None,
    beside: int = 0,
) -> DecodeLoop:
    """The loop over (left-padded) `input_ids`, before its first step: first windows, the step policy the settings
    pick and the dynamic backend (which feeds the prompt), writing to `record`; `max_new_tokens` per row. With a
    `history`, lossless mode also drafts from those texts (prompt lookup's search, turned on); `beside`: the rows
    these join after their first step, which lossless mode prices its first draft widths with."""
    settings, layout, logits_processor = setup.settings, setup.layout, setup.processors
    state = _first_window(input_ids, mask, layout, tuple(record.token_scores), setup.vocab_size, max_new_tokens)
    if record.sampling is None:  # `generate()`: the call's processors, densely where they allow it
        record.sampling = RowSampling.from_processors(
            logits_processor, generation_config.do_sample, input_ids.shape[0], input_ids.device, layout.mask_id
        )
        if record.sampling is not None:
            logits_processor = LogitsProcessorList()  # every one of them is in `record.sampling`
    do_sample = bool(generation_config.do_sample) or (record.sampling is not None and record.sampling.may_sample)
    contiguous = settings.lossless and do_sample
    filler = SlotFiller(layout, settings, record, logits_processor, do_sample, contiguous)
    if settings.lossless:
        verifier = Verifier(logits_processor, record, do_sample)
        adaptive = settings.draft_schedule == "adaptive"
        lookup = None
        if settings.prompt_lookup or history is not None:
            lookup = PromptLookup(
                settings.prompt_lookup_ngram, settings.prompt_lookup_tokens, history, settings.prompt_lookup_matches,
                settings.prompt_lookup_min_ngram,
            )
        tree = lookup is not None and trees_allowed(model, settings, logits_processor, record, do_sample)
        if lookup is not None and not tree and lookup.matches > 2:
            logger.warning(
                f"`wedlm_prompt_lookup_matches={lookup.matches}`: this call cannot verify matches as branches (they "
                "need SDPA or eager attention, no `wedlm_static`, and processors, penalties and kept scores that "
                "read no prefix), so only the latest match drafts; drop the option or what rules trees out."
            )
        policy = LosslessPolicy(
            layout, record, filler, state, adaptive, verifier, lookup, is_wedlm_trained(model), tree, beside=beside
        )
    else:
        warn_if_window_does_not_pay(settings.cost(input_ids.device.type), input_ids.shape[0], settings.window_size)
        policy = PlainPolicy(layout, record, filler, blockwise=settings.blockwise)
    return DecodeLoop(state, layout, record, policy, DynamicBackend(model, mask, prompt_padded))


def trees_allowed(
    model: PreTrainedModel, settings: WeDLMSettings, processors: LogitsProcessorList, record: OutputRecord,
    do_sample: bool,
) -> bool:
    """Whether lossless mode may verify lookup drafts as a branch beside the window's (`tree.py`): a 4D mask the
    attention takes, forwards of free width, scores that read no prefix (processors left after per-row sampling
    took what it could; penalties are refused per row) and none kept, random draws keyed per row."""
    return (
        getattr(model.config, "_attn_implementation", None) in MASK_IMPLEMENTATIONS
        and not settings.static
        and not processors
        and not record.token_scores
        and (not do_sample or record.sampling is not None)
    )


def static_backend(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    generation_config: GenerationConfig,
    layout: WindowLayout,
    max_new_tokens: int,
) -> PoolBackend:
    """`wedlm_static`: the steps after the prompt's run over a pool row per input row, at fixed shapes, compiled
    when `compiles` says so. As in transformers' static cache, `max_cache_len` sizes the pool for the longest call,
    so later calls with other prompt lengths reuse the compiled step."""
    needed = input_ids.shape[1] + max_new_tokens + layout.width
    max_cache_len = max(needed, generation_config.max_cache_len or 0)
    compiled = model.get_compiled_call(generation_config.compile_config) if compiles(model, generation_config) else None
    return PoolBackend(model, input_ids.shape[0], layout.mask_id, max_cache_len, layout.width, compiled)


def pad_token_id(generation_config: GenerationConfig) -> int:
    """What pads a row: `pad_token_id`, else the first EOS id, else 0 (the config's special tokens prepared)."""
    pad_id, eos_ids = generation_config._pad_token_tensor, generation_config._eos_token_tensor
    return int(pad_id) if pad_id is not None else (int(eos_ids.flatten()[0]) if eos_ids is not None else 0)


def _first_window(
    input_ids: torch.LongTensor,
    mask: torch.Tensor,
    layout: WindowLayout,
    kinds: tuple[str, ...],
    vocab_size: int,
    max_new_tokens: torch.Tensor,
) -> WindowState:
    """Every row's state before the first forward: an all-mask window of `window_size` slots (within
    max_new_tokens), fed together with the prompt (lossless prompt lookup may draft its first slots: lossless.py)."""
    batch_size, device = input_ids.shape[0], input_ids.device
    width, zeros = layout.width, torch.zeros(batch_size, dtype=torch.long, device=device)
    return WindowState(
        rows=torch.arange(batch_size, device=device),
        window=torch.full((batch_size, width), layout.mask_id, dtype=torch.long, device=device),
        length=max_new_tokens.clamp(max=layout.window_size),
        generated=zeros,
        max_new_tokens=max_new_tokens,
        processed=torch.zeros_like(zeros),
        first_position=mask.long().sum(1),
        fill_step=torch.zeros((batch_size, width), dtype=torch.long, device=device),
        done=torch.zeros(batch_size, dtype=torch.bool, device=device),
        scores=WindowScores({kind: torch.zeros(batch_size, width, vocab_size, device=device) for kind in kinds}),
        prompt=input_ids,
        prompt_positions=(mask.long().cumsum(1) - 1).clamp(min=0),
    )
