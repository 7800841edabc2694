"""The options table (`wedlm_hf/generation/options.py`) is the one declaration of every WeDLM option: each option
is accepted everywhere the table exposes it (a `generate` keyword, a command-line flag of `generate` single and
`--input`, a batch-row key, a `serve` default, a demo control, `finetune`'s generation config) and nowhere else."""

import json

import pytest
from tiny_models import MASK_ID, random_prompts, tiny_model
from transformers import GenerationConfig

import wedlm_hf
import wedlm_hf_cli
from wedlm_hf.batch.checks import check_generation_settings
from wedlm_hf.batch.rows import RowError, parse_row
from wedlm_hf.commands.generate import generation_options
from wedlm_hf.commands.generate_batch import _check_arguments
from wedlm_hf.demo.logic import DecodeParams, generate_options
from wedlm_hf.finetune.recipe import FinetuneOptions, wedlm_generation_config
from wedlm_hf.generation.options import CLI, DEMO, FINETUNE, OPTIONS, ROWS, SERVE, Accepts, WeDLMOption
from wedlm_hf.generation.settings import WeDLMSettings

LOOKUP = {"wedlm_lossless": True, "wedlm_prompt_lookup": True}
COMPANIONS = {
    "wedlm_draft_schedule": {"wedlm_lossless": True},
    "wedlm_prompt_lookup": {"wedlm_lossless": True},
    "wedlm_prompt_lookup_ngram": LOOKUP,
    "wedlm_prompt_lookup_min_ngram": LOOKUP,
    "wedlm_prompt_lookup_tokens": LOOKUP,
    "wedlm_prompt_lookup_matches": LOOKUP,
}
"""Options that are legal only with another one."""


def sample(option: WeDLMOption) -> tuple[object, str]:
    """A legal value other than the default, and how the command line spells it."""
    accepts = option.accepts
    if option.keyword == "mask_token_id":
        return MASK_ID, str(MASK_ID)
    if accepts.choices:
        return accepts.choices[-1], accepts.choices[-1]
    if accepts.kind == "bool":
        return True, ""
    value = accepts.minimum + (1 if accepts.kind == "int" else 0.5)
    return value, str(value)


def ids(option: WeDLMOption) -> str:
    return option.keyword


@pytest.fixture(scope="module")
def model():
    return wedlm_hf.enable(tiny_model("wedlm"))


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_every_option_is_a_generate_keyword_that_resolves_to_its_setting(model, option):
    value, _ = sample(option)
    kwargs = {option.keyword: value, **COMPANIONS.get(option.keyword, {})}
    settings = WeDLMSettings.resolve(GenerationConfig(), model.config, model.config.vocab_size, **kwargs)
    assert getattr(settings, option.setting) == value
    input_ids, attention_mask = random_prompts([4, 3])
    output = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, decoding="wedlm", max_new_tokens=4,
        return_dict_in_generate=True, **{"mask_token_id": MASK_ID, **kwargs},
    )
    assert output.wedlm_stats is not None


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_a_bad_value_is_refused_by_name(model, option):
    bad = "nonsense" if option.accepts.kind != "str" else 3
    with pytest.raises(ValueError, match=option.keyword):
        WeDLMSettings.resolve(GenerationConfig(), model.config, model.config.vocab_size, **{option.keyword: bad})


def parse(*argv: str):
    return wedlm_hf_cli.build_parser(list(argv)).parse_args(list(argv))


def flag_argv(option: WeDLMOption) -> list[str]:
    _, text = sample(option)
    return [option.flag] + ([text] if text else [])


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_command_line_flags_follow_the_table(option, tmp_path):
    value, _ = sample(option)
    if CLI not in option.exposed:
        with pytest.raises(wedlm_hf_cli.UserError):
            parse("generate", "x", *flag_argv(option))
        return
    assert generation_options(parse("generate", "x", *flag_argv(option)))[option.keyword] == value
    if option.flag_off:
        assert generation_options(parse("generate", "x", option.flag_off))[option.keyword] is False
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n')
    batch = parse("generate", "--input", str(source), "--output", str(tmp_path / "out.jsonl"), *flag_argv(option))
    _check_arguments(batch)  # batch mode takes every option the single-prompt mode takes
    assert generation_options(batch)[option.keyword] == value


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_batch_rows_follow_the_table(model, option):
    value, _ = sample(option)
    item = {"prompt": "a", option.keyword: value, **COMPANIONS.get(option.keyword, {})}
    if ROWS not in option.exposed:
        with pytest.raises(RowError, match="unknown key"):
            parse_row(item, 0, "row 0", 0)
        return
    row = parse_row(item, 0, "row 0", 0)
    generate_kwargs = {"decoding": "wedlm", "max_new_tokens": 4, "mask_token_id": MASK_ID}
    check_generation_settings(model, [row], [[5, 6]], generate_kwargs)
    with pytest.raises(RowError, match=f"row 0: '{option.keyword}' must be"):
        parse_row({"prompt": "a", option.keyword: "nonsense"}, 0, "row 0", 0)


@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_serve_follows_the_table(option, monkeypatch):
    serving = pytest.importorskip("wedlm_hf.serving", exc_type=ImportError)  # its extra, or its transformers release
    value, _ = sample(option)
    calls = []
    monkeypatch.setattr(serving, "serve", lambda model, **options: calls.append(options))
    if SERVE not in option.exposed:
        assert option.keyword not in serving.GENERATION_OPTIONS
        with pytest.raises(wedlm_hf_cli.UserError):
            parse("serve", *flag_argv(option))
        return
    assert wedlm_hf_cli.main(["serve", *flag_argv(option), "--port", "9"]) == 0
    assert calls[0]["generation_defaults"] == {option.keyword: value}
    assert option.keyword in serving.GENERATION_OPTIONS


def test_demo_and_finetune_follow_the_table():
    params = DecodeParams(window_size=4, entropy_threshold=0.5, pos_penalty_factor=0.1, temperature=0.0,
                          max_new_tokens=8, lossless=True)
    options = generate_options(params, "wedlm")
    for option in OPTIONS:
        assert (option.keyword in options) == (DEMO in option.exposed)
    config = wedlm_generation_config(GenerationConfig(), FinetuneOptions(), mask_id=MASK_ID)
    for option in OPTIONS:
        if FINETUNE in option.exposed:
            assert getattr(config, option.keyword) == option.default


def test_accepts_describes_and_checks_alike():
    threshold = Accepts("number", minimum=0, none_means="one slot per step")
    assert threshold(None) and threshold(0.5) and not threshold(-1) and not threshold(True) and not threshold("1")
    assert threshold.describe() == "a number >= 0, or None for one slot per step"
    assert threshold.describe("json") == "a number >= 0, or null for one slot per step"
    assert threshold.describe("cli") == "a number >= 0, or 'none' for one slot per step"
    assert threshold.parse("None") is None and threshold.parse("0.25") == 0.25
    assert Accepts("bool").describe("json") == "true or false" and not Accepts("bool")(1)


def test_old_flags_still_work():
    """`--threshold` and `--penalty` were the README's spellings before the table named every flag."""
    args = parse("generate", "x", "--threshold", "none", "--penalty", "0.1")
    assert generation_options(args)["wedlm_entropy_threshold"] is None
    assert generation_options(args)["wedlm_pos_penalty_factor"] == 0.1


def test_plain_works_in_batch_mode(tmp_path, capsys):
    """`--plain` exists for single prompts, so `--input` takes it too (it was refused as unsupported)."""
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": "1, 2, 3,"}) + "\n")
    argv = ["generate", "--input", str(source), "--output", str(output), "--plain", "--max-new-tokens", "4"]
    assert wedlm_hf_cli.main(argv + ["--no-progress"]) == 0, capsys.readouterr().err
    (row,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert row["id"] == "a" and row["stats"]["tokens"] == 4 and "drafted" not in row["stats"]  # plain, not lossless


@pytest.mark.parametrize("command", [("train",), ("finetune", "m", "--data", "d", "--output-dir", "o")], ids=["train", "finetune"])
@pytest.mark.parametrize("option", OPTIONS, ids=ids)
def test_train_and_finetune_flags_follow_the_table(command, option):
    """Both write the options exposed to `FINETUNE` into their output's generation config: each has its flag (and
    its old spellings) there, no other option does, and the mode flags default to None (the evaluation chooses)."""
    if FINETUNE not in option.exposed:
        with pytest.raises(wedlm_hf_cli.UserError):
            parse(*command, *flag_argv(option))
        return
    value, text = sample(option)
    assert getattr(parse(*command, *flag_argv(option)), option.setting) == value
    for old in option.old_flags:
        assert getattr(parse(*command, old, text), option.setting) == value
    if option.flag_off:
        assert getattr(parse(*command, option.flag_off), option.setting) is False
        assert getattr(parse(*command), option.setting) is None
