"""The forward cost model (`wedlm_hf/generation/forward_cost.py`): one module, standard library only, that lossless
mode's draft width, plain mode's warning and the vLLM drafter all read; its scale is declared per device type,
measured by a profile and stored per device and model (`cost_profile.py`), or given per call."""

import ast
import json
import math
import sys

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

import wedlm_hf
from wedlm_hf.bench.measure import ForwardCounter
from wedlm_hf.cost_profiles import store
from wedlm_hf.generation import cost_profile, forward_cost, plain
from wedlm_hf.generation.forward_cost import ForwardCost
from wedlm_hf.generation.mask_slots import MASK_SLOTS
from wedlm_vllm import cost as vllm_cost


def test_the_module_imports_only_the_standard_library_and_the_vllm_drafter_reads_it():
    tree = ast.parse(open(forward_cost.__file__, encoding="utf-8").read())
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in imports if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in imports if isinstance(node, ast.ImportFrom)]
    imported = {name.split(".")[0] for name in names}
    assert imported <= sys.stdlib_module_names
    assert vllm_cost.forward_cost.__file__ == forward_cost.__file__
    assert vllm_cost.forward_scale("cpu") == forward_cost.SCALES["cpu"]
    assert vllm_cost.forward_scale("cuda") == forward_cost.DEFAULT_SCALE


def test_a_step_costs_its_fixed_part_plus_its_tokens():
    cost = ForwardCost.declared("cpu")
    assert cost.relative(1, 1) == 1 and cost.relative(8, 17) == (cost.scale + 8 * 17) / (cost.scale + 8)
    assert cost.step(10, True) == cost.step(10) + cost.verify_share * cost.scale
    assert ForwardCost.declared("cpu", 100).scale == 100 and ForwardCost.declared("cuda").scale > cost.scale
    assert [row for row, _ in cost.table((1, 8, 32), (1, 4))] == [1, 8, 32]


@pytest.mark.parametrize("columns,tokens", [(16, 8.0), (8, 4.0), (3, 1.5)])
def test_a_wide_step_loses_from_the_batch_size_the_model_names(columns, tokens):
    cost = ForwardCost.declared("cpu")
    start = cost.loses_from(columns, tokens)

    def loses(rows: int) -> bool:
        return cost.step(rows * columns, True) > tokens * cost.step(rows)

    assert loses(start) and (start == 1 or not loses(start - 1))
    assert cost.loses_from(4, 4.0) is None


def _constant_model():
    """A model whose AR and mask predictions agree everywhere (all logits 0): every draft passes."""
    model = wedlm_hf.enable(tiny_model("wedlm", peak=40))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    return model


def test_the_scale_override_decides_whether_a_wide_batch_pays():
    """At batch 32 no draft width pays on a CPU, however well drafts pass: lossless mode runs greedy steps; told that
    a step's fixed part is worth 100000 tokens (an accelerator's), the same call checks drafts. The output is
    greedy's either way."""
    model = _constant_model()
    input_ids, attention_mask = random_prompts([5 + i % 7 for i in range(32)], seed=1)
    common = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=24, eos_token_id=None)
    greedy = model.generate(**common, decoding="ar")
    lossless = dict(decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID, return_dict_in_generate=True)
    declared = model.generate(**common, **lossless)
    cheap = model.generate(**common, **lossless, wedlm_forward_scale=100000)
    assert torch.equal(declared.sequences, greedy) and torch.equal(cheap.sequences, greedy)
    assert declared.wedlm_stats.forwards[0] == 24 and sum(declared.wedlm_stats.drafted) == 0
    assert cheap.wedlm_stats.forwards[0] < 12
    with pytest.raises(ValueError, match="wedlm_forward_scale"):
        model.generate(**common, **lossless, wedlm_forward_scale=0)


def test_plain_mode_warns_once_past_the_batch_size_where_its_window_pays():
    model = _constant_model()
    start = ForwardCost.declared("cpu").loses_from(16, plain.PREDICTABLE_SHARE * 16)
    transformers_logging.warning_once.cache_clear()
    for rows, warned in ((start - 1, False), (start, True)):
        input_ids, attention_mask = random_prompts([4] * rows, seed=2)
        with CaptureLogger(plain.logger) as captured:
            for _ in range(2):
                model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=2, decoding="wedlm",
                    mask_token_id=MASK_ID, wedlm_window_size=16,
                )
        assert captured.out.count("wedlm_lossless=True") == int(warned), rows


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """A file of stored profiles of its own."""
    path = tmp_path / "profiles" / "forward_cost.json"
    monkeypatch.setenv(store.PROFILE_FILE_VARIABLE, str(path))
    return path


def test_the_profile_file_is_in_the_hugging_face_cache_unless_named(monkeypatch, tmp_path):
    monkeypatch.delenv(store.PROFILE_FILE_VARIABLE)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert store.profile_path() == tmp_path / "wedlm_hf" / "forward_cost.json"


@pytest.mark.parametrize("scale,premium", [(3.0, 0.0), (24.0, 0.0), (300.0, 0.0), (12.0, 0.6), (24.0, 1.5)])
def test_the_fit_recovers_the_scale_and_premium_of_forwards_that_follow_the_model(scale, premium):
    samples = [
        (rows, width, 0.001 * (scale * (1 + premium * (width > 1)) + rows * width))
        for rows in (1, 8, 32) for width in cost_profile.WIDTHS
    ]
    fitted_scale, fitted_premium = forward_cost.fitted(samples)
    assert abs(math.log2(fitted_scale / scale)) <= 1 / 16  # the grid's steps are 2^(1/8) and 1/20
    assert abs(fitted_premium - premium) <= 0.05


def test_the_fit_of_forwards_that_do_not_grow_is_the_largest_scale_and_one_width_fits_nothing():
    flat = [(rows, width, 0.01) for rows in (1, 8) for width in (1, 4, 16)]
    assert forward_cost.fitted(flat) == (round(forward_cost.LARGEST_SCALE, 1), 0.0)
    with pytest.raises(ValueError, match="one-column and a wider forward"):
        forward_cost.fitted([(1, 1, 0.01), (8, 4, 0.02)])


def test_a_premium_prices_every_wider_forward_and_narrows_what_pays():
    """A CPU forward of two tokens per row may cost far more than the line through one and sixteen says (matrix
    kernels in place of matrix-vector ones): the premium is paid once by every wider step, so a draft must pass
    more often to pay, and a plain window loses from a smaller batch."""
    line, jump = ForwardCost.declared("cpu", 12), ForwardCost.declared("cpu", 12, premium=0.6)
    assert jump.relative(1, 1) == 1 and jump.relative(1, 2) == pytest.approx(line.relative(1, 2) + 0.6 * 12 / 13)
    assert jump.step(4, True) - line.step(4, True) == pytest.approx(0.6 * 12) and jump.step(1) == line.step(1)
    assert jump.loses_from(4, 1.8) == 1 < line.loses_from(4, 1.8)
    drafts_pay = [
        [(1 + sum(rate**depth for depth in range(1, drafts + 1))) / cost.step(2 * drafts + 2, True) > 1 / cost.step(1)
         for cost in (line, jump)]
        for rate in (0.5, 0.7, 0.9) for drafts in (1, 3)
    ]
    assert all(paid_with_line >= paid_with_jump for paid_with_line, paid_with_jump in drafts_pay)
    assert any(paid_with_line and not paid_with_jump for paid_with_line, paid_with_jump in drafts_pay)


def test_a_profile_of_the_model_is_measured_once_then_read_from_its_file(profiles):
    """`"measure"`: the first call times forwards and stores the fit; the second (as a new process would) reads
    the file and runs no forward. `"auto"` reads it too, `"declared"` ignores it, a number overrides both."""
    model = wedlm_hf.enable(tiny_model("wedlm"))
    with ForwardCounter(model) as first:
        cost, source = cost_profile.chosen_cost(model, "measure")
    assert first.calls > 0 and 1 <= cost.scale <= forward_cost.LARGEST_SCALE and math.isfinite(cost.scale)
    assert 0 <= cost.premium <= forward_cost.LARGEST_PREMIUM and "measured here" in source
    (key, stored), = json.loads(profiles.read_text()).items()
    assert key == store.profile_key(model) and (stored["scale"], stored["premium"]) == (cost.scale, cost.premium)
    assert {(rows, width) for rows, width, _ in stored["samples"]} >= {(1, width) for width in cost_profile.WIDTHS}
    assert all(seconds > 0 for *_, seconds in stored["samples"])
    with ForwardCounter(model) as second:
        assert cost_profile.chosen_cost(model, "measure")[0] == cost_profile.chosen_cost(model, "auto")[0] == cost
        assert cost_profile.chosen_cost(model, None)[0] == cost
    assert second.calls == 0
    assert cost_profile.chosen_cost(model, "declared")[0] == ForwardCost.declared("cpu")
    assert cost_profile.chosen_cost(model, 100) == (ForwardCost.declared("cpu", 100), "given by wedlm_forward_scale")


def test_auto_without_a_stored_profile_is_the_declared_scale_and_measures_nothing(profiles):
    model = wedlm_hf.enable(tiny_model("wedlm"))
    with ForwardCounter(model) as counter:
        cost, source = cost_profile.chosen_cost(model, "auto")
    assert cost == ForwardCost.declared("cpu") and "declared" in source and counter.calls == 0
    assert not profiles.exists()


def test_without_a_store_as_exported_remote_code_runs_a_profile_is_measured_and_kept_nowhere(profiles, monkeypatch):
    """The Hub's remote code touches no file: no store there, so "auto" is the declared scale, "measure" times."""
    monkeypatch.setattr(cost_profile, "STORE", None)
    model = wedlm_hf.enable(tiny_model("wedlm"))
    assert cost_profile.chosen_cost(model, "auto")[1] == "declared for cpu"
    with ForwardCounter(model) as counter:
        _, source = cost_profile.chosen_cost(model, "measure")
    assert counter.calls > 0 and source.startswith("measured here on") and "stored" not in source
    assert not profiles.exists()


def test_a_profile_is_keyed_by_device_and_model():
    small, wide = tiny_model("wedlm"), tiny_model("wedlm").to(torch.float64)
    assert store.profile_key(small) != store.profile_key(wide)
    assert store.profile_key(small) != store.profile_key(tiny_model("llama"))
    assert store.profile_key(small).startswith(store.device_name(torch.device("cpu")))


def test_the_profile_stays_within_its_time_budget_past_batch_one():
    """A budget already spent by batch 1 measures batch 1 alone (the least a fit needs)."""
    profile = cost_profile.measure_profile(tiny_model("wedlm"), budget_s=0.0)
    assert {rows for rows, _, _ in profile["samples"]} == {1}


def test_a_profile_feeds_its_wider_forwards_mask_slots_as_a_window_does():
    """A draft-only adapter works at mask slots only (`draft_adapter/gate.py`): the profile marks every token after a
    forward's first as one, so the adapter's cost is in the widths the decoder is priced with."""
    model, fed = tiny_model("wedlm"), []

    def record(module, args, kwargs):
        slots = MASK_SLOTS.get()
        fed.append((kwargs["input_ids"].shape[1], None if slots is None else slots.suffix.shape[1]))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        cost_profile.measure_profile(model, budget_s=0.0)
    finally:
        handle.remove()
    assert (cost_profile.CONTEXT, None) in fed and (1, None) in fed
    assert {width: slots for width, slots in fed if width != cost_profile.CONTEXT} == {
        width: (width - 1 if width > 1 else None) for width in cost_profile.WIDTHS
    }


def test_an_unreadable_profile_file_counts_as_none_and_the_next_store_rewrites_it(profiles):
    profiles.parent.mkdir(parents=True)
    profiles.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert store.stored_profile("key") is None
    with pytest.warns(UserWarning, match="unreadable"):
        store.store_profile("key", {"scale": 5.0})
    assert store.stored_profile("key") == {"scale": 5.0}
    assert [path.name for path in profiles.parent.iterdir()] == [profiles.name]  # no temporary file left


def test_the_file_is_parsed_once_per_version(profiles, monkeypatch):
    """Every `generate()` call reads the stored profile: a file parsed once serves them all until it is replaced."""
    store.store_profile("key", {"scale": 5.0})
    parses = []
    monkeypatch.setattr(store.json, "loads", lambda text: parses.append(text) or json.JSONDecoder().decode(text))
    store._parsed.cache_clear()
    assert store.stored_profile("key") == store.stored_profile("key") == {"scale": 5.0} and len(parses) == 1
    store.store_profile("key", {"scale": 7.0})
    assert store.stored_profile("key") == {"scale": 7.0}


def test_the_decoder_prices_with_the_stored_profile(profiles):
    """A profile stored for this device and model decides like `wedlm_forward_scale` does: at batch 32 on a CPU
    the declared scale runs greedy steps, a stored scale of an accelerator's size checks drafts; "declared"
    ignores the profile. The output is greedy's every time."""
    model = _constant_model()
    input_ids, attention_mask = random_prompts([5 + i % 7 for i in range(32)], seed=1)
    common = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=24, eos_token_id=None)
    lossless = dict(decoding="wedlm", wedlm_lossless=True, mask_token_id=MASK_ID, return_dict_in_generate=True)
    store.store_profile(store.profile_key(model), {"scale": 100000.0, "measured": "then"})
    greedy = model.generate(**common, decoding="ar")
    stored = model.generate(**common, **lossless)
    declared = model.generate(**common, **lossless, wedlm_forward_scale="declared")
    assert torch.equal(stored.sequences, greedy) and torch.equal(declared.sequences, greedy)
    assert stored.wedlm_stats.forwards[0] < 12 and declared.wedlm_stats.forwards[0] == 24


@pytest.mark.parametrize("bad", ["fast", "Auto", 0, 0.5, -3, True, [24]])
def test_a_bad_scale_setting_is_refused_by_name(bad):
    model = _constant_model()
    input_ids, attention_mask = random_prompts([4], seed=1)
    with pytest.raises(ValueError, match=r"`wedlm_forward_scale` must be a number >= 1 or 'auto' or 'measure' or"):
        model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=2, decoding="wedlm",
            mask_token_id=MASK_ID, wedlm_forward_scale=bad,
        )
