"""The demo's logic without a browser: input validation, generate keywords, stats text, the step view's HTML, and
the engine racing both decodings of a tiny random model (including Stop)."""

import re
import string
import threading
from dataclasses import fields
from pathlib import Path

import pytest
from tiny_models import EOS_ID, MASK_ID, PAD_ID, tiny_model
from transformers import GenerationConfig

import wedlm_hf
from wedlm_hf.demo.engine import StopRegistry, load_generation_config, load_model, race
from wedlm_hf.demo.logic import (
    EXAMPLES,
    SLIDERS,
    DecodeParams,
    InputError,
    checkpoint_defaults,
    first_difference,
    format_stats,
    format_verdict,
    generate_options,
    lossless_default,
    validate_params,
    validate_prompt,
)
from wedlm_hf.demo.step_view import STEP_VIEW_CSS, render_step_view
from wedlm_hf.generation.settings import DEFAULT_ENTROPY_THRESHOLD, DEFAULT_POS_PENALTY_FACTOR, DEFAULT_WINDOW_SIZE
from wedlm_hf.loading import NAMED_MODELS

DEFAULTS = {name: spec.default for name, spec in SLIDERS.items()}


def save_tiny_checkpoint(path: Path, peak: float = 100.0) -> Path:
    """A tiny random WeDLM model and a character-level tokenizer, saved like a real checkpoint.

    The head is scaled by `peak` so many slots are confident and WeDLM takes multi-token steps.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    characters = string.digits + string.ascii_letters + " ,.:;!?-+=()[]'\"/*#_<>\n"
    vocab = {token: i for i, token in enumerate(specials + list(characters))}
    assert (vocab["<pad>"], vocab["</s>"]) == (PAD_ID, EOS_ID) and len(vocab) < MASK_ID
    vocab["[MASK]"] = MASK_ID
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: one token per character
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="[MASK]",
    )
    tokenizer.save_pretrained(path)
    tiny_model("wedlm", peak=peak).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    return str(save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-wedlm")))


def test_sliders_follow_the_parameter_fields():
    assert list(SLIDERS) + ["lossless"] == [f.name for f in fields(DecodeParams)]  # the toggle is a checkbox
    for spec in SLIDERS.values():
        assert spec.minimum <= spec.default <= spec.maximum


def test_defaults_are_valid_and_typed():
    params = validate_params(**DEFAULTS)
    assert params == DecodeParams(16, 0.4, 0.02, 0.0, 64)
    assert isinstance(params.window_size, int) and isinstance(params.max_new_tokens, int)


def test_whole_floats_are_accepted_for_integer_sliders():
    assert validate_params(**{**DEFAULTS, "window_size": 8.0}).window_size == 8


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("window_size", 0, "between 1 and 64"),
        ("window_size", 2.5, "whole number"),
        ("window_size", True, "must be a number"),
        ("entropy_threshold", -0.1, "between 0 and 3"),
        ("entropy_threshold", float("nan"), "must be a number"),
        ("pos_penalty_factor", None, "must be a number"),
        ("temperature", "hot", "must be a number"),
        ("max_new_tokens", 10_000, "between 1 and 256"),
    ],
)
def test_bad_slider_values_give_a_message(name, value, message):
    with pytest.raises(InputError, match=message) as error:
        validate_params(**{**DEFAULTS, name: value})
    assert SLIDERS[name].label in str(error.value)


@pytest.mark.parametrize("prompt", ["", "   \n", None])
def test_empty_prompt_is_refused(prompt):
    with pytest.raises(InputError, match="prompt"):
        validate_prompt(prompt)


def test_generate_options_share_length_and_sampling():
    params = DecodeParams(8, 0.5, 0.1, 0.0, 32)
    wedlm, ar = generate_options(params, "wedlm"), generate_options(params, "ar")
    assert wedlm == {
        "decoding": "wedlm",
        "max_new_tokens": 32,
        "do_sample": False,
        "return_dict_in_generate": True,
        "wedlm_window_size": 8,
        "wedlm_entropy_threshold": 0.5,
        "wedlm_pos_penalty_factor": 0.1,
        "wedlm_lossless": False,
    }
    assert ar == {"decoding": "ar", "max_new_tokens": 32, "do_sample": False, "return_dict_in_generate": True}
    sampled = generate_options(DecodeParams(8, 0.5, 0.1, 0.7, 32), "ar")
    assert sampled["do_sample"] and sampled["temperature"] == 0.7


def test_format_stats():
    expected = "**WeDLM** · 64 tokens · 25 forwards · 2.56 tokens/forward · 32.0 tokens/s"
    assert format_stats("WeDLM", 64, 2.0, 25) == expected
    assert format_stats("AR", 3, 0.0, note="running…") == "**AR** · 3 tokens · – tokens/s · running…"


def test_step_view_rows_follow_the_window():
    # window 2: forward 1 fills tokens 0-1; forward 2 commits them, feeds two new mask slots and fills token 2;
    # forward 3 commits 2 and fills 3; token 3 is committed with no forward after it (forwards + 1).
    html = render_step_view(["a", " ", "<b>", "\n"], [1, 1, 2, 3], [2, 2, 3, 4], window_size=2, forwards=3)
    cells = re.findall(r'class="wd-cell wd-(\w+)" style="grid-row:(\d+);grid-column:(\d+)"[^>]*>([^<]*)<', html)
    assert cells == [
        ("new", "1", "2", "a"),
        ("new", "1", "3", "␣"),
        ("commit", "2", "2", "a"),
        ("commit", "2", "3", "␣"),
        ("new", "2", "4", "&lt;b&gt;"),
        ("mask", "2", "5", "·"),
        ("commit", "3", "4", "&lt;b&gt;"),
        ("new", "3", "5", "⏎"),
        ("commit", "4", "5", "⏎"),
    ]
    assert "4 (no forward)" in html and "<b>" not in html
    # the text line: background = committing forward, underline = filling forward, the numbers in the tooltip
    assert 'title="token 2: filled in forward 2, committed in forward 3"' in html


def test_step_view_of_nothing_and_of_mismatched_traces():
    assert "No tokens" in render_step_view([], [], [], window_size=4)
    with pytest.raises(ValueError, match="one fill and one commit step per token"):
        render_step_view(["a"], [1, 1], [2], window_size=4)


def test_stop_registry_reaches_the_running_generation():
    runs = StopRegistry()
    first = runs.start("s")
    second = runs.start("s")  # a new run in the same session stops the old one
    assert first.is_set() and not second.is_set()
    runs.finish("s", first)  # the old run ending does not forget the new one
    assert runs.stop("s") and second.is_set()
    assert not runs.stop("s") and not runs.stop("other")


def test_load_model_refuses_a_blank_name():
    with pytest.raises(InputError, match="Choose a model"):
        load_model("  ")


def _race_to_the_end(checkpoint: str, stop: threading.Event, max_new_tokens: int):
    model, tokenizer = load_model(checkpoint)
    params = validate_params(**{**DEFAULTS, "max_new_tokens": max_new_tokens})
    snapshots = 0
    for progress in race(model, tokenizer, "1, 2, 3, 4,", params, stop, poll_seconds=0.05):
        snapshots += 1
    return progress, snapshots


def test_race_streams_both_sides_to_the_end(tiny_checkpoint):
    stop = threading.Event()
    progress, snapshots = _race_to_the_end(tiny_checkpoint, stop, max_new_tokens=24)
    assert snapshots >= 1 and stop.is_set()  # the finished race releases its flag
    for side, state in progress.items():
        assert state.done and state.error is None, (side, state.error)
        sequence = state.output.sequences[0].tolist()
        assert state.token_ids == sequence[len(sequence) - len(state.token_ids) :]  # streamed = returned
        assert 0 < len(state.token_ids) <= 24
    stats = progress["wedlm"].output.wedlm_stats
    assert stats.generated[0] == len(progress["wedlm"].token_ids) == len(stats.fill_steps[0])
    assert stats.tokens_per_forward[0] > 1  # the peaky head lets WeDLM commit several tokens per forward


def test_stop_flag_ends_both_sides_after_one_token(tiny_checkpoint):
    stop = threading.Event()
    stop.set()
    progress, _ = _race_to_the_end(tiny_checkpoint, stop, max_new_tokens=256)
    assert [len(state.token_ids) for state in progress.values()] == [1, 1]


def test_closing_the_race_stops_the_threads(tiny_checkpoint):
    model, tokenizer = load_model(tiny_checkpoint)
    stop = threading.Event()
    snapshots = race(model, tokenizer, "1, 2,", validate_params(**{**DEFAULTS, "max_new_tokens": 256}), stop)
    next(snapshots)
    snapshots.close()  # what Gradio does when the event is cancelled
    assert stop.is_set()


def test_lossless_toggle_reaches_the_wedlm_side_only():
    params = validate_params(**{**DEFAULTS, "lossless": True})
    assert generate_options(params, "wedlm")["wedlm_lossless"] is True
    assert "wedlm_lossless" not in generate_options(params, "ar")
    sampled = generate_options(validate_params(**{**DEFAULTS, "lossless": True, "temperature": 0.7}), "wedlm")
    assert sampled["wedlm_lossless"] is True and sampled["do_sample"] is True  # lossless sampling: exact in law
    with pytest.raises(InputError, match="Lossless"):
        validate_params(**{**DEFAULTS, "lossless": "yes"})


def test_sliders_start_from_the_checkpoint_generation_config():
    embedded = load_generation_config(wedlm_hf.DEFAULT_MODEL)
    values, note = checkpoint_defaults(embedded)
    assert values == {
        "window_size": embedded.wedlm_window_size,
        "entropy_threshold": embedded.wedlm_entropy_threshold,
        "pos_penalty_factor": embedded.wedlm_pos_penalty_factor,
    }
    assert values["entropy_threshold"] != DEFAULT_ENTROPY_THRESHOLD  # the embedded checkpoint tunes its own
    assert "from the checkpoint's generation config." in note and "τ 1," in note and "λ 0.05" in note
    library = {"window_size": DEFAULT_WINDOW_SIZE, "entropy_threshold": DEFAULT_ENTROPY_THRESHOLD,
               "pos_penalty_factor": DEFAULT_POS_PENALTY_FACTOR}
    for missing in (None, GenerationConfig(do_sample=False)):
        values, note = checkpoint_defaults(missing)
        assert values == library and "library defaults" in note
    values, note = checkpoint_defaults(GenerationConfig(wedlm_window_size=8, wedlm_entropy_threshold=None))
    assert values == {**library, "window_size": 8, "entropy_threshold": 0.0} and "else the library" in note
    too_wide = GenerationConfig(wedlm_window_size=500)
    assert checkpoint_defaults(too_wide)[0]["window_size"] == SLIDERS["window_size"].maximum
    assert load_generation_config("/no/such/checkpoint") is None


def test_lossless_checkbox_starts_from_the_checkpoint_generation_config():
    assert not lossless_default(load_generation_config(wedlm_hf.DEFAULT_MODEL))
    assert not lossless_default(None) and not lossless_default(GenerationConfig(do_sample=False))
    assert lossless_default(GenerationConfig(wedlm_lossless=True))
    shipped = GenerationConfig.from_pretrained(NAMED_MODELS["smollm2-wedlm"]())  # the adapter's folder, as shipped
    assert lossless_default(shipped)


def test_examples_cover_what_the_model_does_well_and_what_it_does_not():
    labels = [example.label for example in EXAMPLES]
    assert any("Counting" in label for label in labels) and any("Python" in label for label in labels)
    assert any("NOT trained" in label for label in labels)
    assert all(validate_prompt(example.prompt) for example in EXAMPLES)


@pytest.mark.parametrize(
    "wedlm, ar, expected",
    [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 5, 3], 1), ([1, 2], [1, 2, 3], 2), ([], [4], 0), ([], [], None)],
)
def test_first_difference(wedlm, ar, expected):
    assert first_difference(wedlm, ar) == expected


def test_verdict_reports_speedup_forwards_and_agreement():
    same = format_verdict([1, 2, 3, 4], 1.0, [1, 2, 3, 4], 4.0, 4.0)
    assert same == "**WeDLM x4.00 vs AR** (tokens/s) · 4.00 tokens/forward · identical to AR"
    differs = format_verdict([1, 9, 3, 4], 2.0, [1, 2, 3, 4, 5, 6], 2.0, 1.5, sampled=True)
    assert "x0.67 vs AR" in differs and "diverges from AR at token 1 (both sides sample)" in differs
    assert "no speed-up to report" in format_verdict([], 0.0, [1], 1.0, 0.0)


def test_step_view_wraps_into_bands_that_fit_the_page():
    # 40 committed one per forward, window 4: one grid would be 40 columns wide
    tokens = [f"tok{t:02d}" for t in range(40)]  # 5 characters + 2 of padding each: 20 per 140-character band
    steps = list(range(1, 41))
    html = render_step_view(tokens, steps, [s + 1 for s in steps], window_size=4, forwards=40)
    assert re.findall(r'class="wd-band-title">tokens (\d+)–(\d+)<', html) == [("0", "19"), ("20", "39")]
    columns = [int(c) for c in re.findall(r"grid-column:(\d+)", html)]
    assert max(columns) == 21  # the label column + 20 tokens per band
    assert "max-width: 8ch" in STEP_VIEW_CSS and "overflow-wrap: anywhere" in STEP_VIEW_CSS
    # a forward appears in a band only where its window holds more than masks: forward 18 (token 17 predicted,
    # 18-20 masks) is not in the second band; forward 20 (token 19 predicted) is in the first, with masks 20-22 not
    second = html[html.index("tokens 20–39") :]
    assert '>18</div>' not in second and '>21</div>' in second
    assert "⏎" in render_step_view(["a\n"], [1], [2], window_size=2)  # a newline token stays visible in the line
