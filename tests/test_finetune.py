"""`wedlm-hf finetune` / `wedlm_hf.finetune`: data, mask token, the Trainer recipe (full, LoRA, 2-process DP)."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from default_decoding_check import shown_right, written_default
from local_server import free_port
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    get_cosine_schedule_with_warmup,
)

import wedlm_hf
from wedlm_hf.cli import main as wedlm_hf_cli
from wedlm_hf.finetune import FinetuneOptions, finetune, mask_token
from wedlm_hf.finetune.data import build_rows, read_records
from wedlm_hf.finetune.mask_token import ensure_mask_token, unused_special_token
from wedlm_hf.generation.mask_slots import forward_with_mask_slots
from wedlm_hf.loading import load_model_and_tokenizer, pretrained_path
from wedlm_hf.training import DualStreamCollator

CHAT = {"messages": [{"role": "user", "content": "count to five"}, {"role": "assistant", "content": "1, 2, 3, 4, 5"}]}
FAST = dict(
    seq_len=48, block_size=16, batch_size=4, max_steps=24, warmup_steps=2, logging_steps=4, eval_steps=12, save_steps=12,
    evaluate=True, eval_repeats=1,  # 24 steps is a trial run: evaluated because asked to be; the timings are unused
)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama folder with the embedded tokenizer, stripped of its mask token (a plain LM)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    tokenizer.mask_token = None
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def counting_data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    lines = [json.dumps({"text": ", ".join(str(j) for j in range(i, i + 30))}) for i in range(30)] + [json.dumps(CHAT)] * 4
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path



def test_chat_rows_mask_only_the_assistant_tokens(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    [row] = build_rows(read_records_from([CHAT]), tokenizer, 64)
    ids, maskable = torch.tensor(row["input_ids"]), torch.tensor(row["maskable"])
    assert tokenizer.decode(ids[maskable]).strip() == "1, 2, 3, 4, 5"
    assert not maskable[-1]  # right padding is never maskable
    prompt_length = len(tokenizer.apply_chat_template(CHAT["messages"][:1], add_generation_prompt=True)["input_ids"])
    assert not maskable[:prompt_length].any()


def read_records_from(records: list[dict]):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))
    try:
        return read_records(handle.name)
    finally:
        os.unlink(handle.name)


def test_text_rows_are_packed_and_keep_the_tail(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    rows = build_rows(read_records_from([{"text": "1, 2, 3, 4, 5, 6, 7"}] * 5), tokenizer, 16)
    stream = [t for r in rows for t, m in zip(r["input_ids"], r["maskable"]) if m]
    one = tokenizer("1, 2, 3, 4, 5, 6, 7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert stream == one * 5  # nothing dropped: the ragged tail is a padded row
    assert all(len(r["input_ids"]) == 16 for r in rows)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "line 2: not valid JSON"),
        ('["a"]', "line 2: expected a JSON object"),
        ('{"text": "a", "messages": []}', "line 2: a record needs exactly one"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "line 2: a chat needs at least one 'assistant'"),
        ('{"text": ""}', "line 2: 'text' must be a non-empty string"),
    ],
)
def test_bad_lines_are_named_by_number(tmp_path, line, message):
    path = write_jsonl(tmp_path / "d.jsonl", ['{"text": "fine"}', line])
    with pytest.raises(ValueError, match=message):
        read_records(path)


def test_too_long_chat_is_an_error_not_a_silent_cut(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    with pytest.raises(ValueError, match="line 1: the chat is .* more than --seq-len 4"):
        build_rows(read_records_from([CHAT]), tokenizer, 4)


def test_collator_masks_only_maskable_tokens():
    length = 32
    maskable = torch.zeros(length, dtype=torch.bool)
    maskable[10:25] = True
    collator = DualStreamCollator(mask_token_id=99, block_size=8, seed=0)
    batch = collator([{"input_ids": torch.arange(length), "maskable": maskable}] * 64)
    prediction = batch["input_ids"][:, length:]
    masked_positions = batch["position_ids"][:, length:][prediction == 99]
    assert masked_positions.numel() > 0 and maskable[masked_positions].all()
    assert (batch["labels"][:, length:] != -100).eq(prediction == 99).all()
    memory_targets = batch["labels"][:, :length] != -100
    assert torch.equal(memory_targets[0].nonzero().flatten(), torch.arange(9, 24))  # next token is maskable
    # the weights make the masked part an unbiased per-token estimate: 1/g per masked slot, over 15 maskable tokens
    assert batch["loss_weights"][:, length:].sum(dim=1).mean().item() == pytest.approx(1.0, rel=0.1)


def test_mask_token_added_reused_or_kept(tiny_llama, monkeypatch):
    monkeypatch.setattr(mask_token, "NEW_MASK_TOKEN", "<|not-in-vocab|>")  # the embedded vocabulary has <|mask|>
    model, tokenizer = load_model_and_tokenizer(str(tiny_llama))
    rows = model.get_input_embeddings().num_embeddings
    mask_id, new = ensure_mask_token(model, tokenizer)
    assert new and tokenizer.convert_ids_to_tokens(mask_id) == "<|not-in-vocab|>"
    assert model.get_input_embeddings().num_embeddings == rows + 1 == len(tokenizer)
    assert model.config.mask_token_id == model.generation_config.mask_token_id == mask_id
    assert ensure_mask_token(model, tokenizer) == (mask_id, False)  # known to the model now
    model, tokenizer = load_model_and_tokenizer(str(tiny_llama))
    reused, new = ensure_mask_token(model, tokenizer, reuse=True)
    assert new and reused < rows and model.get_input_embeddings().num_embeddings == rows
    assert tokenizer.convert_ids_to_tokens(reused) == unused_special_token(tokenizer)
    with pytest.raises(ValueError, match="--mask-token 'nope'"):
        ensure_mask_token(*load_model_and_tokenizer(str(tiny_llama)), token="nope")


def test_full_finetune_loss_falls_and_output_decodes_with_wedlm_by_default(tiny_llama, counting_data, tmp_path):
    summary = finetune(str(tiny_llama), str(counting_data), str(tmp_path / "out"), FinetuneOptions(**FAST, learning_rate=3e-3))
    assert summary["written"] == "model" and summary["steps"] == 24
    assert summary["eval"]["eval_loss"] < 0.7 * summary["eval_before"]["eval_loss"]
    assert {"eval_mdm", "eval_ar"} <= set(summary["eval"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(model).__name__ == "LlamaForCausalLM"  # a non-Qwen family stays its own class
    config = model.generation_config
    assert config.decoding == "wedlm" and config.mask_token_id == model.config.mask_token_id
    expected = shown_right(tmp_path / "out")  # no mode flag: what its own evaluation shows right
    assert summary["default_decoding"]["keywords"] == expected == written_default(tmp_path / "out", expected)
    assert {keyword: getattr(config, keyword) for keyword in expected} == expected
    assert summary["evaluation"]["settings"]["thresholds"] == [0.2, 0.4, 0.8]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    inputs = tokenizer("3, 4, 5,", return_tensors="pt")
    out = wedlm_hf.enable(model).generate(**inputs, max_new_tokens=8, return_dict_in_generate=True)
    assert out.wedlm_stats.summary()["generated"] == 8  # WeDLM ran without being asked for


def test_whole_model_lora_writes_an_adapter_that_loads_with_peft(tiny_llama, counting_data, tmp_path):
    peft = pytest.importorskip("peft")
    output = tmp_path / "adapter"
    options = FinetuneOptions(**FAST, lora_r=4, whole_model=True, learning_rate=1e-2)
    summary = finetune(str(tiny_llama), str(counting_data), str(output), options)
    assert summary["written"] == "adapter" and (output / "adapter_model.safetensors").is_file()
    expected = shown_right(output)  # no mode flag: what its own evaluation shows right
    assert summary["default_decoding"]["keywords"] == expected == written_default(output, expected)
    assert summary["eval"]["eval_loss"] < summary["eval_before"]["eval_loss"]
    base, _ = load_model_and_tokenizer(str(tiny_llama))
    with_peft = peft.PeftModel.from_pretrained(base, output).eval()
    merged, tokenizer = load_model_and_tokenizer(str(output))  # base + adapter merged, the adapter's configs
    assert merged.generation_config.decoding == "wedlm"
    assert {keyword: getattr(merged.generation_config, keyword) for keyword in expected} == expected
    ids = tokenizer("1, 2, 3, 4", return_tensors="pt")["input_ids"]
    with torch.no_grad():  # lossless: exactly greedy, drafts counted
        lossless = wedlm_hf.enable(merged).generate(
            ids, decoding="wedlm", wedlm_lossless=True, max_new_tokens=8, return_dict_in_generate=True
        )
        greedy = merged.generate(ids, decoding="ar", max_new_tokens=8)
    assert torch.equal(lossless.sequences, greedy) and "drafted" in lossless.wedlm_stats.summary()
    mask_id = merged.generation_config.mask_token_id
    probe = torch.cat([ids, torch.tensor([[mask_id]])], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(merged(probe).logits, with_peft(probe).logits, atol=1e-4, rtol=1e-4)
        untouched = load_model_and_tokenizer(str(tiny_llama))[0](probe).logits
    assert not torch.allclose(merged(probe).logits, untouched, atol=1e-3)  # the adapter changed something
    plain = AutoModelForCausalLM.from_pretrained(pretrained_path(str(output)))  # for code that loads by path (serve)
    assert plain.generation_config.decoding == "wedlm"
    assert {keyword: getattr(plain.generation_config, keyword) for keyword in expected} == expected
    with torch.no_grad():
        torch.testing.assert_close(plain(probe).logits, merged(probe).logits)
    config = json.loads((output / "generation_config.json").read_text())
    (output / "generation_config.json").write_text(json.dumps({**config, "wedlm_window_size": 8}))
    edited = GenerationConfig.from_pretrained(pretrained_path(str(output)))  # a new merged copy, not a stale one
    assert edited.wedlm_window_size == 8


def test_cli_finetune_errors_are_one_line(tmp_path, tiny_llama, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", ['{"text": "ok"}', "{broken"])
    assert wedlm_hf_cli(["finetune", str(tiny_llama), "--data", str(bad), "--output-dir", str(tmp_path / "o")]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "bad.jsonl line 2: not valid JSON" in error
    assert wedlm_hf_cli(["finetune", str(tiny_llama), "--data", str(bad), "--output-dir", "o", "--merge"]) == 1
    assert "--merge merges a LoRA adapter" in capsys.readouterr().err
    draft_plain = ["finetune", str(tiny_llama), "--data", str(bad), "--output-dir", "o", "--lora-r", "4", "--plain"]
    assert wedlm_hf_cli(draft_plain) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "error: --plain: plain WeDLM commits a draft-only adapter's drafts" in error
    assert wedlm_hf_cli([*draft_plain[:-1], "--whole-model", "--plain", "--lossless"]) == 1
    assert "not allowed with argument --plain" in capsys.readouterr().err
    assert wedlm_hf_cli([*draft_plain[:-1], "--whole-model", "--entropy-threshold", "-1"]) == 1
    assert "--entropy-threshold" in capsys.readouterr().err
    for flags, message in ((["--warmup-steps", "-1"], "--warmup-steps must be"), (["--eval-repeats", "0"], "--eval-repeats must")):
        assert wedlm_hf_cli([*draft_plain[:-1], *flags]) == 1
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and message in error
    assert wedlm_hf_cli([*draft_plain[:-1], "--evaluate", "--no-evaluate"]) == 1
    assert "not allowed with argument --evaluate" in capsys.readouterr().err


def test_a_non_empty_output_dir_needs_overwrite_or_resume(tmp_path, tiny_llama, counting_data, capsys, monkeypatch):
    """As `export` and batch `generate` refuse: nothing is loaded or written over without being asked."""
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    argv = ["finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", str(output)]
    assert wedlm_hf_cli(argv) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and f"{output} is not empty: pass --overwrite" in error and "--resume" in error
    assert [path.name for path in output.iterdir()] == ["notes.txt"]
    runs = []
    monkeypatch.setattr("wedlm_hf.finetune.recipe.finetune", lambda *args: runs.append(args) or {})
    for flag in ("--overwrite", "--resume"):
        assert wedlm_hf_cli([*argv, flag]) == 0
    assert len(runs) == 2


@pytest.mark.parametrize(
    "flags, keywords, reason",
    [
        (["--no-evaluate"], {"wedlm_lossless": True}, "not evaluated"),
        (["--no-evaluate", "--lossless"], {"wedlm_lossless": True}, "chosen by --lossless"),
        (
            ["--plain", "--threshold", "0.6", "--evaluate", "--eval-repeats", "1"],
            {"wedlm_lossless": False, "wedlm_prompt_lookup": False, "wedlm_entropy_threshold": 0.6},
            "chosen by --plain",
        ),
    ],
    ids=["not-evaluated", "lossless", "plain-evaluated"],
)
def test_default_decoding_given_or_not_evaluated_is_written_as_such(tiny_llama, counting_data, tmp_path, capsys, flags, keywords, reason):
    """An explicit mode is written as given, even where the evaluation runs (plain then at the given threshold
    alone); without one and without the evaluation, lossless. Summary, card and printed lines say which and why."""
    output = tmp_path / "out"
    argv = [
        "finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", str(output), "--seq-len", "48",
        "--block-size", "16", "--max-steps", "2", "--eval-steps", "2", "--save-steps", "2", "--whole-model", "--lora-r", "4",
    ]
    assert wedlm_hf_cli([*argv, *flags]) == 0
    assert written_default(output, keywords) == keywords
    summary = json.loads((output / "finetune_summary.json").read_text())
    assert summary["default_decoding"]["keywords"] == keywords and reason in summary["default_decoding"]["reason"]
    assert ("evaluation" in summary) == ("--no-evaluate" not in flags)
    if "evaluation" in summary:
        assert summary["evaluation"]["settings"]["thresholds"] == [0.6]  # a given threshold is the one evaluated
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("default decoding: ")]
    assert len(printed) == 1 and reason in printed[0]
    assert "## Default decoding" in (output / "README.md").read_text()


def test_two_process_data_parallel_with_torchrun(tiny_llama, counting_data, tmp_path):
    output = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "wedlm_hf.cli", "finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", str(output),
        "--seq-len", "48", "--block-size", "16", "--max-steps", "4", "--eval-steps", "4", "--save-steps", "4",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((output / "finetune_summary.json").read_text())
    assert summary["steps"] == 4
    assert summary["tokens_seen"] == 4 * 4 * 48 * 2  # two processes, each its own batch of 4 rows
    assert AutoModelForCausalLM.from_pretrained(output).generation_config.decoding == "wedlm"


def test_lora_writes_a_draft_only_adapter_that_loads_three_ways_with_the_gate_on(tiny_llama, counting_data, tmp_path):
    peft = pytest.importorskip("peft")
    output = tmp_path / "draft"
    summary = finetune(str(tiny_llama), str(counting_data), str(output), FinetuneOptions(**FAST, lora_r=4, learning_rate=1e-2))
    assert summary["written"] == "draft-only adapter" and summary["ar_weight"] == 0.0
    assert set(summary["eval"]) >= {"eval_loss", "eval_mdm"} and "eval_ar" not in summary["eval"]
    assert summary["eval"]["eval_loss"] < summary["eval_before"]["eval_loss"]
    config = json.loads((output / "generation_config.json").read_text())
    assert config["wedlm_lossless"] is True and config["decoding"] == "wedlm"
    expected = shown_right(output, plain_allowed=False)  # lossless, with lookup if its evaluation shows it faster
    assert summary["default_decoding"]["keywords"] == expected == written_default(output, expected)
    base, tokenizer = load_model_and_tokenizer(str(tiny_llama))
    mask_id = config["mask_token_id"]
    ids = tokenizer(["1, 2, 3, 4, 5, 6", "10, 11, 12"], return_tensors="pt", padding=True)
    probe = torch.cat([ids["input_ids"], torch.full((2, 3), mask_id)], 1)
    observed = ids["input_ids"].shape[1]
    with torch.no_grad():
        base_logits = base(probe).logits
        greedy = base.generate(**ids, max_new_tokens=12, do_sample=False)
    loaded, _ = load_model_and_tokenizer(str(output))  # 1. wedlm_hf.loading: attached, not merged
    with_peft = wedlm_hf.enable(peft.PeftModel.from_pretrained(load_model_and_tokenizer(str(tiny_llama))[0], output))
    with_transformers = wedlm_hf.enable(AutoModelForCausalLM.from_pretrained(output))  # 3. PEFT integration
    for model in (loaded, with_peft, with_transformers):
        with torch.no_grad():
            logits = forward_with_mask_slots(model, torch.ones(2, 3, dtype=torch.bool), input_ids=probe).logits
            lossless = model.generate(**ids, decoding="wedlm", wedlm_lossless=True, max_new_tokens=12)
        assert torch.equal(logits[:, :observed], base_logits[:, :observed])
        assert not torch.allclose(logits[:, observed:], base_logits[:, observed:])  # the trained adapter drafts
        assert model.generation_config.wedlm_lossless is True  # the folder's default, however it was loaded
        assert torch.equal(lossless, greedy)
    by_path = pretrained_path(str(output))  # for code that loads by path (serve): base + adapter, gated by enable
    served = wedlm_hf.enable(AutoModelForCausalLM.from_pretrained(by_path))
    assert served.generation_config.wedlm_lossless is True  # the adapter's generation config, as serve needs it
    with torch.no_grad():
        slots = torch.ones(2, 3, dtype=torch.bool)
        assert torch.equal(*(forward_with_mask_slots(m, slots, input_ids=probe).logits for m in (served, loaded)))
        assert torch.equal(served.generate(**ids, max_new_tokens=12), greedy)  # its default: lossless WeDLM
    assert wedlm_hf_cli(["finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", "o", "--lora-r", "4", "--merge"]) == 1


def printed_details(out: str) -> list[Path]:
    """The files the closing line says the run wrote beside the model."""
    [line] = [line for line in out.splitlines() if line.startswith("wrote ")]
    return [Path(path) for path in line.split("; details: ")[1].split(", ")]


SMOKE = re.compile(r"^<!-- smoke -->\n```bash\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)


def test_the_documented_smoke_recipe_runs_skips_the_evaluation_and_names_what_it_wrote(tmp_path, monkeypatch, capsys, caplog):
    """docs/finetune.md's first try, as documented: the data line, then `finetune` on the embedded checkpoint. A
    5-step run is a trial: the evaluation is skipped in one line saying how to force it, the default decoding is
    lossless, and the closing line names only files that exist."""
    make_data, command = SMOKE.search((Path(__file__).parents[1] / "docs" / "finetune.md").read_text()).group(1).splitlines()
    monkeypatch.chdir(tmp_path)
    assert make_data.startswith("python ")
    subprocess.run(sys.executable + make_data[len("python"):], shell=True, check=True)
    environment, program, *argv = shlex.split(command)
    assert (environment, program) == ("OMP_NUM_THREADS=1", "wedlm-hf") and "--evaluate" not in argv
    assert wedlm_hf_cli(argv) == 0
    out = capsys.readouterr().out
    skipped = [record.getMessage() for record in caplog.records if "evaluation skipped" in record.getMessage()]
    assert len(skipped) == 1 and "--evaluate" in skipped[0] and "fewer than 50" in skipped[0]
    output = tmp_path / argv[argv.index("--output-dir") + 1]
    summary = json.loads((output / "finetune_summary.json").read_text())
    assert summary["steps"] == 5 and "evaluation" not in summary
    assert summary["default_decoding"]["keywords"] == {"wedlm_lossless": True} == written_default(output, {"wedlm_lossless": True})
    details = printed_details(out)
    assert [path.name for path in details] == ["finetune_summary.json", "README.md"]
    assert all((tmp_path / path).is_file() for path in details) and not (output / "evaluation.md").exists()
    assert AutoModelForCausalLM.from_pretrained(output).generation_config.decoding == "wedlm"


def test_short_run_evaluates_when_asked_with_its_repeats_and_a_progress_bar(tiny_llama, counting_data, tmp_path, capsys, caplog):
    """`--evaluate` forces the evaluation after 2 steps; `--eval-repeats 1` sizes it; a tqdm bar on stderr counts
    every decode (a warm-up per decoding, then per prompt an instrumented pass and one timed repeat) to its end; the
    closing line names the evaluation's files, which exist."""
    output = tmp_path / "out"
    argv = [
        "finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", str(output), "--seq-len", "48",
        "--block-size", "16", "--max-steps", "2", "--save-steps", "2", "--evaluate", "--eval-repeats", "1",
    ]
    assert wedlm_hf_cli(argv) == 0
    captured = capsys.readouterr()
    assert not [record for record in caplog.records if "evaluation skipped" in record.getMessage()]
    summary = json.loads((output / "finetune_summary.json").read_text())
    assert summary["evaluation"]["settings"]["repeats"] == 1
    prompts = {row["domain"]: row["prompts"] for row in summary["evaluation"]["rows"]}  # a row per domain and decoding
    decodings = len(summary["evaluation"]["rows"]) // len(prompts)
    total = sum(decodings * (1 + count * 2) for count in prompts.values())
    assert re.search(rf"evaluate held-out \w+: 100%\|.*\| {total}/{total} ", captured.err.replace("\r", "\n"))
    details = printed_details(captured.out)
    assert [path.name for path in details] == ["finetune_summary.json", "README.md", "evaluation.md", "evaluation.json"]
    assert all(path.is_file() for path in details)


@pytest.mark.parametrize(
    "flags, warmup, rates",
    [([], 1, [0.0, 1.0, 0.5]), (["--warmup-steps", "10"], 2, [0.0, 0.5, 1.0])],
    ids=["default-share", "clipped"],
)
def test_warmup_fits_the_run_and_the_logged_learning_rate_reaches_its_peak(
    tiny_llama, counting_data, tmp_path, caplog, flags, warmup, rates
):
    """3 steps: the default warm-up (a tenth of the run) is 1 step; 10 steps is clipped to 2 with one warning line.
    The rates `Trainer` logs are transformers' cosine-with-warm-up schedule at that warm-up, reaching the peak."""
    output = tmp_path / "out"
    argv = [
        "finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", str(output), "--seq-len", "48",
        "--block-size", "16", "--max-steps", "3", "--save-steps", "3", "--logging-steps", "1", "--learning-rate", "1e-3",
        "--no-evaluate", *flags,
    ]
    assert wedlm_hf_cli(argv) == 0
    warned = [record.getMessage() for record in caplog.records if "--warmup-steps" in record.getMessage()]
    assert len(warned) == len(flags) // 2 and all("the warm-up is 2 steps" in line for line in warned)
    history = json.loads((output / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    logged = [entry["learning_rate"] for entry in history if "learning_rate" in entry]
    schedule = get_cosine_schedule_with_warmup(torch.optim.SGD([torch.zeros(1)], lr=1e-3), warmup, 3).lr_lambdas[0]
    assert [schedule(step) for step in range(3)] == pytest.approx(rates)
    assert logged == pytest.approx([1e-3 * rate for rate in rates]) and max(logged) == pytest.approx(1e-3)
