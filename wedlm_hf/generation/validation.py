"""Every check of a WeDLM `generate` request, run once per call before anything is allocated.

`check_request` refuses options WeDLM decoding would otherwise ignore (before settings are resolved);
`check_settings` the combinations of resolved settings and the model/request they cannot serve; `checked_prompt`
reads and checks the prompt's padding and length. `position_limit_error` is the one prompt + max_new_tokens check,
which the batch jobs, the command line and the benchmarks call too.
"""

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.configuration_utils import GenerationMode

from .attention import MASK_IMPLEMENTATIONS
from .processors import check_processors
from .settings import WeDLMSettings
from .support import check_supported
from .transformers_version import CACHE_KEYWORD


class UnsupportedRequest(ValueError):
    """A `generate` option that WeDLM decoding cannot honour (transformers' usual decoding may)."""


def reject_unsupported(generation_config: GenerationConfig) -> None:
    """Refuse the generation options that WeDLM decoding would otherwise ignore."""

    def given(name: str):
        return getattr(generation_config, name, None)

    num_beams = given("num_beams")
    if num_beams is not None and num_beams > 1:
        raise UnsupportedRequest(f"WeDLM decoding is not beam search: got num_beams={num_beams}; use num_beams=1.")
    if given("prompt_lookup_num_tokens") is not None:
        raise UnsupportedRequest(
            "`prompt_lookup_num_tokens` selects transformers' prompt-lookup decoding; WeDLM has its own, verified "
            "with its window's drafts: drop it and pass `wedlm_lossless=True, wedlm_prompt_lookup=True` "
            "(`wedlm_prompt_lookup_tokens` sets the draft length)."
        )
    for name in ("output_hidden_states", "output_attentions"):
        if given(name):
            raise UnsupportedRequest(
                f"`{name}=True`: WeDLM forwards see reordered windows of slots, not one new position per step, so "
                f"there are no per-token {name[7:]} to return; run `model(output.sequences, {name}=True)` on the "
                "generated sequences instead."
            )
    reject_cache_implementation(given("cache_implementation"))
    if given("use_cache") is False:
        raise UnsupportedRequest(
            "`use_cache=False`: WeDLM decoding needs the KV cache (committed tokens are never recomputed); drop "
            "`use_cache=False`."
        )


def reject_cache_implementation(cache_implementation: str | None) -> None:
    """WeDLM builds its own cache. transformers acts on this option (a paged cache switches to continuous
    batching) before it hands the loop to a `custom_generate` callable, so `generate(decoding="wedlm")` checks the
    call's value up front as well."""
    if cache_implementation not in (None, "static"):
        raise UnsupportedRequest(
            f"`cache_implementation={cache_implementation!r}`: WeDLM decoding builds its own cache "
            "(`WeDLMCache`, which crops what a window forward wrote, or with `cache_implementation='static'` the "
            "fixed-shape `KVPool`); drop `cache_implementation` (pass `cache_implementation=None` where "
            "the generation config sets it) or pass 'static'."
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


def check_request(
    model: PreTrainedModel, generation_config: GenerationConfig, model_kwargs: dict, synced_gpus: bool
) -> None:
    """The model and the options of one request, before its WeDLM settings are resolved (the logits processors
    are checked with them: what lossless mode honours differs, `check_settings`)."""
    check_supported(model)
    reject_unsupported(generation_config)
    reject_other_modes(generation_config)
    if model_kwargs.get("inputs_embeds") is not None:
        raise UnsupportedRequest(
            "WeDLM decoding needs `input_ids` (mask slots are token ids); `inputs_embeds` is not supported."
        )
    if synced_gpus:
        raise UnsupportedRequest("WeDLM decoding does not support `synced_gpus=True`.")
    cache = model_kwargs.get(CACHE_KEYWORD)
    if cache is not None and cache.get_seq_length() > 0:
        raise UnsupportedRequest(
            "WeDLM decoding builds its own cache; a filled `cache` / `past_key_values` from an earlier call cannot be "
            "continued. Pass the full sequence as `input_ids` instead."
        )


def check_settings(
    settings: WeDLMSettings,
    model: PreTrainedModel,
    generation_config: GenerationConfig,
    logits_processor: LogitsProcessorList,
) -> None:
    """The resolved settings against the model and the request: special tokens, static shapes, lossless mode."""
    _check_special_tokens(settings, generation_config)
    implementation = model.config._attn_implementation
    if settings.static and implementation not in MASK_IMPLEMENTATIONS:
        raise ValueError(
            f"`wedlm_static=True` feeds a 4D attention mask, which attn_implementation={implementation!r} does "
            f"not take; load the model with attn_implementation='sdpa' (or 'eager'), or use wedlm_static=False."
        )
    check_processors(logits_processor, settings.lossless)


def _check_special_tokens(settings: WeDLMSettings, generation_config: GenerationConfig) -> None:
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


def checked_prompt(
    model: PreTrainedModel, input_ids: torch.LongTensor, model_kwargs: dict, max_new_tokens: int
) -> tuple[torch.Tensor, list[int]]:
    """The prompt's 2D padding mask, checked (WeDLM needs left padding and at least one real token per row, and
    room for `max_new_tokens` after the longest), and each row's prompt length."""
    if input_ids.shape[1] == 0:
        raise ValueError("`input_ids` is empty: WeDLM decoding needs at least one prompt token (e.g. the BOS token).")
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:
        attention_mask, lengths = torch.ones_like(input_ids), [input_ids.shape[1]] * input_ids.shape[0]
    else:
        lengths = _checked_padding(input_ids, attention_mask)
    problem = position_limit_error(model, max(lengths), max_new_tokens)
    if problem is not None:
        raise ValueError(f"The longest prompt: {problem}")
    return attention_mask, lengths


def _checked_padding(input_ids: torch.LongTensor, attention_mask: torch.Tensor) -> list[int]:
    """Each row's prompt length from its padding mask, which must be left padding with a real token per row."""
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
    return lengths


def position_limit_error(
    model: PreTrainedModel, prompt_tokens: int, max_new_tokens: int, budget_name: str = "max_new_tokens"
) -> str | None:
    """Why `prompt_tokens` + `max_new_tokens` do not fit the model's positions, or None if they do; the message
    names the budget as the caller's user sets it (`budget_name`)."""
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is None or prompt_tokens + max_new_tokens <= limit:
        return None
    return (
        f"{prompt_tokens} prompt tokens plus {budget_name}={max_new_tokens} exceed the model's "
        f"max_position_embeddings ({limit}); shorten the prompt or lower {budget_name}."
    )
