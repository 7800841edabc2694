"""What a user sees from `wedlm-hf`: batch mode takes every option one prompt takes, argument errors are one line
naming the option (exit status 1, no usage block), and `finetune` prints progress and a short summary."""

import json
import re
import warnings
from pathlib import Path

import pytest
from test_finetune import counting_data, tiny_llama  # noqa: F401 (fixtures)
from transformers import AutoTokenizer

import wedlm_hf
from wedlm_hf.commands.generate_batch import BATCH_OPTIONS, SINGLE_PROMPT_ONLY
from wedlm_hf.generation.options import CLI, exposed_to
from wedlm_hf_cli import build_parser, main

PROMPT = "1, 2, 3, 4,"
MASK_ID = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL).mask_token_id
WEDLM_VALUES = {
    "wedlm_window_size": ["4"], "wedlm_entropy_threshold": ["0.5"], "wedlm_pos_penalty_factor": ["0.1"],
    "mask_token_id": [str(MASK_ID)], "wedlm_lossless": [], "wedlm_prompt_lookup": ["--lossless"],
    "wedlm_prompt_lookup_ngram": ["3", "--prompt-lookup", "--lossless"],
    "wedlm_prompt_lookup_min_ngram": ["2", "--prompt-lookup", "--lossless"],
    "wedlm_prompt_lookup_tokens": ["4", "--prompt-lookup", "--lossless"],
    "wedlm_prompt_lookup_matches": ["3", "--prompt-lookup", "--lossless"],
}
EXAMPLES = {
    **{option.keyword: [option.flag, *WEDLM_VALUES[option.keyword]] for option in exposed_to(CLI)},
    "ar": ["--ar"],
    "chat": ["--chat"],
    "do_sample": ["--do-sample", "--seed", "1"],
    "temperature": ["--do-sample", "--temperature", "0.9"],
    "top_p": ["--do-sample", "--top-p", "0.9"],
    "seed": ["--seed", "1"],
    "max_new_tokens": ["--max-new-tokens", "3"],
    "dtype": ["--dtype", "float32"],
    "device": ["--device", "cpu"],
    "threads": ["--threads", "1"],
}
"""One use of each option of one-prompt `generate` (the WeDLM ones from the options table)."""


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def batch(capsys, tmp_path, *options) -> list[dict]:
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n")
    argv = ["generate", "--input", str(source), "--output", str(output), "--overwrite", "--no-progress"]
    code, _, err = run(capsys, *argv, "--max-new-tokens", "6", *options)
    assert code == 0, err
    return [json.loads(line) for line in output.read_text().splitlines()]


def test_the_examples_cover_every_one_prompt_option():
    argv = ["generate", "x"]
    dests = {action.dest for action in build_parser(argv).chosen._actions if action.option_strings}
    assert dests - {"help", "debug", "model", "prompt_file", "stream", *BATCH_OPTIONS} == set(EXAMPLES)
    assert set(SINGLE_PROMPT_ONLY) == {"prompt_file", "stream"}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_batch_mode_accepts_every_one_prompt_option(name, capsys, tmp_path):
    assert len(batch(capsys, tmp_path, *EXAMPLES[name])) == 1


@pytest.mark.parametrize("flags", [["--plain"], ["--lossless"], ["--window-size", "4", "--threshold", "none"]])
def test_batch_row_equals_the_one_prompt_output(flags, capsys, tmp_path):
    code, out, err = run(capsys, "generate", PROMPT, "--max-new-tokens", "6", *flags)
    assert code == 0, err
    assert batch(capsys, tmp_path, *flags)[0]["continuation"] == out.rsplit("\n", 2)[0]


@pytest.mark.parametrize("argv,line", [
    (["--threshold", "abc", PROMPT], "--entropy-threshold/--threshold: must be a number >= 0, or 'none' for one slot per step"),
    (["--window-size", "many", PROMPT], "--window-size: must be an integer >= 1; got 'many'"),
    (["--windw-size", "4", "1, 2, 3,"], "unknown option --windw-size (did you mean --window-size?)"),
    (["--prompt-file", "nope.txt"], "--prompt-file nope.txt: no such file"),
    ([PROMPT, "--stream", "--input", "in.jsonl", "--output", "o.jsonl"], "--stream prints one continuation"),
    (["--max-new-tokens"], "--max-new-tokens: expected one argument"),
    ([PROMPT, "surplus"], "unexpected argument 'surplus'"),
])
def test_argument_error_is_one_line_naming_the_option(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": PROMPT}) + "\n")
    code, out, err = run(capsys, "generate", *argv)
    assert code == 1 and out == ""
    assert err.startswith(f"wedlm-hf generate: error: {line}") and len(err.splitlines()) == 1, err
    assert "usage:" not in err


def test_a_bad_line_exits_as_docs_batch_md_says(capsys, tmp_path):
    """The exit status and message docs/batch.md gives for a bad input line are what the command does."""
    docs = " ".join((Path(__file__).parents[1] / "docs" / "batch.md").read_text().split())
    sentence = re.search(r"A bad line is one line on stderr.*?exit status (\d+)", docs)
    source, output = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"prompt": PROMPT}) + "\n" + json.dumps({"prompt": PROMPT, "temprature": 1}) + "\n")
    output.write_text("kept\n")
    code, out, err = run(capsys, "generate", "--input", str(source), "--output", str(output), "--overwrite")
    assert code == int(sentence.group(1)) == 1
    assert err.startswith(f"wedlm-hf generate: error: {source} line 2: unknown key 'temprature'")
    assert err.count("\n") == 1
    assert output.read_text() == "kept\n"  # not touched


def test_finetune_prints_progress_and_a_short_summary(tiny_llama, counting_data, tmp_path, capsys):  # noqa: F811
    output = tmp_path / "out"
    argv = ["finetune", str(tiny_llama), "--data", str(counting_data), "--output-dir", str(output), "--seq-len", "48",
            "--block-size", "16", "--batch-size", "4", "--max-steps", "4", "--eval-steps", "4", "--save-steps", "4",
            "--lora-r", "2", "--evaluate", "--eval-repeats", "1"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert re.search(r"evaluate [^:]*: 100%", err)  # progress while the evaluation runs, to its end
    lines = out[out.index("4 steps") :].strip().splitlines()  # after Trainer's own log lines
    assert 3 <= len(lines) <= 8, out
    assert f"wrote a draft-only adapter to {output}" in lines[1]
    assert any(line.startswith("held-out") and "lossless" in line for line in lines[2:])
    assert (output / "finetune_summary.json").is_file()  # the whole summary
    deprecations = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert deprecations == []
