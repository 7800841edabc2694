"""The parts of the vLLM plugin (`wedlm_vllm`) that need no vLLM, in the main suite: importing it loads neither
vLLM nor `wedlm_hf`, its options round-trip through the drafter's class name, its draft schedule, and its
model_type "wedlm" config reads every WeDLM config as `wedlm_hf.WeDLMConfig` does (layout, head size, mask id),
with a greedy output equal to `WeDLMForCausalLM`'s on the embedded checkpoint."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

import wedlm_hf
from wedlm_hf import WeDLMConfig, WeDLMForCausalLM
from wedlm_vllm import DrafterOptions, speculative_config
from wedlm_vllm.config import WeDLMVllmConfig
from wedlm_vllm.checks import request_refusal
from wedlm_vllm.cost import forward_scale, pays_at, priced
from wedlm_vllm.schedule import DRAFT_SHARE, PROBE_PERIOD, LastForward, gain_per_token, mask_slots, next_width, split
from wedlm_vllm.step import Row

HUB_CONFIGS = sorted(Path(wedlm_hf.__file__).parent.joinpath("hub_configs").glob("*/config.json"))


def test_importing_the_plugin_loads_neither_vllm_nor_wedlm_hf():
    code = "import sys, wedlm_vllm; print(sorted(m for m in ('vllm', 'wedlm_hf', 'torch') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


@pytest.mark.parametrize(
    "options",
    [DrafterOptions(), DrafterOptions(16), DrafterOptions(None, True), DrafterOptions(0, True), DrafterOptions(3, True, 40)],
)
def test_options_round_trip_through_the_class_name(options):
    model = speculative_config(8, options.mask_token_id, options.prompt_lookup, options.forward_scale)["model"]
    module, _, name = model.rpartition(".")
    assert module == "wedlm_vllm.drafter" and name.isidentifier()
    assert DrafterOptions.from_class_name(name) == options


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: speculative_config(1), "num_speculative_tokens must be >= 2"),
        (lambda: speculative_config("8"), "num_speculative_tokens must be an int"),
        (lambda: speculative_config(mask_token_id=-1), "mask_token_id must be a token id"),
        (lambda: speculative_config(prompt_lookup="yes"), "prompt_lookup must be True or False"),
        (lambda: speculative_config(forward_scale=0), "forward_scale must be an int >= 1"),
        (lambda: DrafterOptions.from_class_name("WeDLMDrafter__window_8"), "unknown WeDLM drafter option 'window_8'"),
        (lambda: DrafterOptions.from_class_name("Other"), "not a WeDLM drafter name"),
    ],
)
def test_bad_options_name_the_option(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def forward(drafts=0, masks=0, accepted=0, prefill=False, length=33) -> LastForward:
    return LastForward(drafts=drafts, masks=masks, accepted=accepted, prefill=prefill, length=length)


@pytest.mark.parametrize(
    ("last", "width"),
    [
        (forward(prefill=True), 8),  # a new request starts narrow...
        (forward(masks=8), 18),  # ...and widens while its drafts pass
        (forward(masks=24), 24),  # mask slots only: all pass, stays wide
        (forward(drafts=12, masks=12, accepted=12), 24),
        (forward(drafts=1, masks=5, accepted=1), 14),  # widening after a probe's draft passed
        (forward(drafts=12, masks=12, accepted=0), 0),  # nothing accepted: one-token forwards
        (forward(drafts=12, masks=12, accepted=2), 6),  # an early rejection: about what was accepted
        (forward(drafts=12, masks=12, accepted=7), 24),  # a late one keeps the width
        (forward(), 0),  # one-token forwards stay so...
        (forward(length=2 * PROBE_PERIOD), 2),  # ...but for a probe of two mask slots now and then
        (forward(drafts=3, accepted=3), 0),  # prompt-lookup drafts alone never widen the mask slots
    ],
)
def test_width_follows_the_last_forward(last, width):
    assert next_width(last, budget=24) == width


def test_split_gives_drafts_at_most_half_the_width():
    assert split(24, 30) == (12, 12) and split(24, 5) == (5, 19) and split(2, 0) == (0, 2) and split(0, 4) == (0, 0)


@pytest.mark.parametrize(
    ("rows", "scale", "kept"),
    [
        (1, 24, 1),  # one request: its drafts pay on any device
        (8, 24, 8),  # eight on a CPU: drafts that pass still pay
        (48, 24, 0),  # 48 on a CPU: a step of 25 tokens per request costs more than its drafts return
        (48, 2048, 48),  # 48 on an accelerator: they pay
    ],
)
def test_drafts_are_kept_where_they_pay_at_the_batch_size(rows, scale, kept):
    """Drafts that all pass: half of a width of 24 passes."""
    assert sum(width > 0 for width in priced([24] * rows, [0.5] * rows, scale)) == kept


@pytest.mark.parametrize("scale", [1, 7, 24, 2048])
def test_pays_at_agrees_with_priced(scale):
    """`pays_at` (the drafter's shortcut past per-request planning) agrees with `priced` at its best gain."""
    for rows in range(1, 2 * scale + 3):
        assert any(priced([24] * rows, [DRAFT_SHARE] * rows, scale)) == pays_at(rows, scale), rows


def test_the_best_requests_draft_first_and_failing_ones_not_at_all():
    assert priced([24, 24, 24, 0], [0.02, 0.4, 0.3, 0.4], scale=24) == [0, 24, 24, 0]


@pytest.mark.parametrize(
    ("last", "gain"),
    [(forward(prefill=True), 0.5), (forward(masks=8), 0.5), (forward(drafts=4, masks=14, accepted=4), 0.5),
     (forward(drafts=12, masks=12, accepted=6), 0.25), (forward(drafts=4, masks=4, accepted=0), 0.0)],
)
def test_gain_per_token_is_the_last_forward_acceptance_times_the_draft_share(last, gain):
    assert gain_per_token(last) == gain


def test_the_scale_is_declared_per_device_type_and_overridable():
    assert forward_scale("cpu") == 24 and forward_scale("cuda") == 2048 and forward_scale("cpu", 100) == 100


def test_mask_slots_are_the_run_of_mask_ids_at_the_end():
    assert [mask_slots(tokens, 9) for tokens in ([], [9, 9], [5, 9, 9], [9, 5], [5, 6])] == [0, 2, 2, 0, 0]


def row(outputs: int, max_tokens: int | None = None, min_tokens: int = 0, stops=()) -> Row:
    return Row(drafts=0, masks=0, fed_prompt=False, logits_start=0, outputs=outputs, max_tokens=max_tokens,
               min_tokens=min_tokens, stop_token_ids=frozenset(stops), slots=None)


@pytest.mark.parametrize(
    ("state", "sampled", "returned"),
    [
        (row(10), [1, 2, 3], 3),
        (row(10, max_tokens=9), [1, 2, 3], 2),  # 7 before this step: two more fit the budget
        (row(10, stops=[2]), [1, 2, 3], 2),  # up to and including the first stop token
        (row(10, min_tokens=10, stops=[2]), [1, 2, 3], 3),  # a stop token before min_tokens does not stop
        (row(3, max_tokens=3), [5, 6, 7], 3),  # the prompt step's token and two more
    ],
)
def test_a_row_counts_the_tokens_vllm_returns(state, sampled, returned):
    assert state.returned(sampled) == returned


def test_a_request_is_a_prompt_step_at_its_first_output_or_when_it_fed_its_prompt():
    assert row(1).prefill([7]) and not row(5).prefill([7])
    assert dataclasses.replace(row(5), fed_prompt=True).prefill([7])  # a preempted request recomputed


class Params:
    def __init__(self, temperature=0.0, extra_args=None):
        self.temperature, self.extra_args = temperature, extra_args


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (Params(), None),
        (Params(extra_args={"wedlm_slots": 0}), None),
        (Params(extra_args={"wedlm_slots": 24}), None),
        (Params(extra_args={"wedlm_slots": 25}), "wedlm_slots=25: give an int from 0"),
        (Params(extra_args={"wedlm_slots": "4"}), "wedlm_slots='4'"),
        (Params(extra_args={"wedlm_slots": True}), "wedlm_slots=True"),
        (Params(temperature=1.0), "this request samples"),
    ],
)
def test_request_checks(params, message):
    refusal = request_refusal(params, on_cpu=True, budget=24)
    assert refusal is None if message is None else message in refusal
    assert request_refusal(Params(temperature=0.7), on_cpu=False, budget=24) is None


@pytest.mark.parametrize("path", HUB_CONFIGS + [Path(wedlm_hf.DEFAULT_MODEL) / "config.json"], ids=lambda p: p.parent.name)
def test_plugin_config_reads_wedlm_configs_as_the_package_does(path):
    fields = json.loads(path.read_text())
    ours, theirs = WeDLMVllmConfig(**fields), WeDLMConfig(**fields)
    for name in ("attention_bias", "qk_norm", "head_dim", "mask_token_id", "num_key_value_heads", "vocab_size"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.architectures == ["Qwen2ForCausalLM" if theirs.attention_bias else "Qwen3ForCausalLM"]


def test_embedded_checkpoint_as_qwen3_generates_what_wedlm_does():
    """The vLLM tests compare with transformers' Qwen3ForCausalLM under the plugin's config: the same tokens."""
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    ids = tokenizer(["1, 2, 3, 4, 5, 6, 7, 8, ", "def read_lines(path):\n"], return_tensors="pt", padding=True)
    config = WeDLMVllmConfig.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    qwen3 = Qwen3ForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL, config=config, dtype=torch.float32)
    wedlm = WeDLMForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL, dtype=torch.float32)
    greedy = dict(max_new_tokens=64, do_sample=False, decoding="ar")
    assert torch.equal(qwen3.generate(**ids, max_new_tokens=64, do_sample=False), wedlm.generate(**ids, **greedy))
