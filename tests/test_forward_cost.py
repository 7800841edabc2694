"""The forward cost model (`wedlm_hf/generation/forward_cost.py`): one module, standard library only, that lossless
mode's draft width, plain mode's warning and the vLLM drafter all read; its scale is overridable per call."""

import ast
import sys

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

import wedlm_hf
from wedlm_hf.generation import forward_cost, plain
from wedlm_hf.generation.forward_cost import ForwardCost
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
