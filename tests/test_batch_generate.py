"""Batch generation: `batch_generate` and `wedlm-hf generate --input` against plain per-row `generate`, on one
process and under `accelerate launch --num_processes 2`, plus resume, bad lines and the empty file."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from local_server import free_port
from transformers import AutoModelForCausalLM, AutoTokenizer
from patience import PATIENCE_S

import wedlm_hf
from wedlm_hf.cli import main

BIN = Path(sys.executable).parent
NEW_TOKENS = 12
ROWS = [
    {"id": "add", "prompt": "def add(a, b):"},
    {"prompt": "import os\n"},  # no id: the line number (2) stands in
    {"id": "cls", "prompt": "class Stack:\n    def __init__(self):\n        self.items = []", "wedlm_lossless": True},
    {"id": "loop", "prompt": "for i in range(10):", "max_new_tokens": 5},
    {"id": "list", "prompt": "x = [", "stop_strings": ["]"]},
    {"id": "lossless-short", "prompt": "def f(x):", "wedlm_lossless": True},
    {"id": "ret", "prompt": "    return"},
]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    return AutoModelForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL).eval(), tokenizer


@pytest.fixture(scope="module")
def per_row(model_and_tokenizer):
    """Each row alone through plain `model.generate`: the reference every batched run must reproduce."""
    model, tokenizer = model_and_tokenizer
    expected = []
    for row in ROWS:
        overrides = {k: v for k, v in row.items() if k not in ("id", "prompt")}
        inputs = tokenizer(row["prompt"], return_tensors="pt")
        kwargs = {"max_new_tokens": NEW_TOKENS, "do_sample": False, **overrides}
        output = model.generate(**inputs, **kwargs, tokenizer=tokenizer, return_dict_in_generate=True)
        length = output.wedlm_stats.generated[0]
        tokens = output.sequences[0, inputs["input_ids"].shape[1] :][:length].tolist()
        expected.append((tokenizer.decode(tokens, skip_special_tokens=True), length, output.wedlm_stats.forwards[0]))
    return expected


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_output(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_against_per_row(results: list[dict], per_row) -> None:
    assert [r["id"] for r in results] == [row.get("id", i + 1) for i, row in enumerate(ROWS)]
    for result, (text, length, forwards) in zip(results, per_row):
        assert result["continuation"] == text, result["id"]
        assert (result["stats"]["tokens"], result["stats"]["forwards"]) == (length, forwards), result["id"]


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_api_equals_per_row_generate(model_and_tokenizer, per_row, batch_size):
    model, tokenizer = model_and_tokenizer
    rows = [{"id": row.get("id", i + 1), **{k: v for k, v in row.items() if k != "id"}} for i, row in enumerate(ROWS)]
    results = wedlm_hf.batch_generate(model, tokenizer, rows, batch_size=batch_size, max_new_tokens=NEW_TOKENS)
    check_against_per_row(results, per_row)
    finish = {r["id"]: r["finish_reason"] for r in results}
    assert finish["loop"] == "length" and results[3]["stats"]["tokens"] == 5
    list_row = results[4]
    assert (list_row["finish_reason"] == "stop") == list_row["continuation"].endswith("]")
    assert "drafted" in results[2]["stats"] and "drafted" not in results[0]["stats"]


def test_api_autoregressive_equals_per_row_greedy(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = [ROWS[0]["prompt"], ROWS[1]["prompt"], ROWS[6]["prompt"]]
    results = wedlm_hf.batch_generate(model, tokenizer, prompts, batch_size=3, decoding="ar", max_new_tokens=NEW_TOKENS)
    for prompt, result in zip(prompts, results):
        inputs = tokenizer(prompt, return_tensors="pt")
        output = model.generate(**inputs, decoding="ar", max_new_tokens=NEW_TOKENS, do_sample=False)
        tokens = output[0, inputs["input_ids"].shape[1] :].tolist()
        assert result["continuation"] == tokenizer.decode(tokens, skip_special_tokens=True)
        assert result["stats"]["tokens"] == len(tokens)
        assert result["finish_reason"] == ("eos" if tokens[-1] == tokenizer.eos_token_id else "length")
    with pytest.raises(ValueError, match="row 1: wedlm_lossless need WeDLM decoding"):
        wedlm_hf.batch_generate(model, tokenizer, [prompts[0], ROWS[2]], decoding="ar", max_new_tokens=NEW_TOKENS)


def test_api_token_budget_and_strings(model_and_tokenizer, per_row):
    model, tokenizer = model_and_tokenizer
    prompts = [ROWS[0]["prompt"], ROWS[6]["prompt"]]
    results = wedlm_hf.batch_generate(model, tokenizer, prompts, max_padded_tokens=20, max_new_tokens=NEW_TOKENS)
    assert [r["id"] for r in results] == [0, 1]
    assert [r["continuation"] for r in results] == [per_row[0][0], per_row[6][0]]


def test_api_messages_use_the_chat_template(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    chat_tokenizer = copy.deepcopy(tokenizer)
    chat_tokenizer.chat_template = "{% for m in messages %}# {{ m['content'] }}\n{% endfor %}"
    messages = [{"role": "user", "content": "add two numbers"}]
    [result] = wedlm_hf.batch_generate(model, chat_tokenizer, [{"messages": messages}], max_new_tokens=6)
    inputs = tokenizer("# add two numbers\n", return_tensors="pt", add_special_tokens=False)
    output = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert result["continuation"] == tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    no_template = copy.deepcopy(tokenizer)
    no_template.chat_template = None
    with pytest.raises(ValueError, match=r"row 0: \"messages\" needs a tokenizer with a chat template"):
        wedlm_hf.batch_generate(model, no_template, [{"messages": messages}], max_new_tokens=6)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a", ', "line 3: not valid JSON"),
        ('["a"]', "line 3: expected a JSON object, got list"),
        ('{"id": "x"}', 'line 3: give exactly one of "prompt"'),
        ('{"prompt": "a", "messages": []}', 'line 3: give exactly one of "prompt"'),
        ('{"prompt": "a", "temprature": 0.5}', "line 3: unknown key 'temprature'"),
        ('{"prompt": "a", "wedlm_window_size": 0}', "line 3: 'wedlm_window_size' must be an integer >= 1"),
        ('{"prompt": "a", "wedlm_lossless": "yes"}', "line 3: 'wedlm_lossless' must be true or false"),
        ('{"prompt": "a", "temperature": 0.7}', "line 3: .*`do_sample` is not set"),
        ('{"prompt": "a", "wedlm_lossless": true, "wedlm_blockwise": true}', "line 3: .*cannot be combined"),
        ('{"id": "add", "prompt": "a"}', "line 3: id 'add' already used at .* line 1"),
        ('{"prompt": "a", "max_new_tokens": 5000}', "line 3: .* exceed the model's max_position_embeddings"),
    ],
)
def test_bad_line_names_it_and_keeps_the_output(tmp_path, capsys, line, message):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(ROWS[0]) + "\n\n" + line + "\n" + json.dumps(ROWS[6]) + "\n")
    output = tmp_path / "out.jsonl"
    kept = '{"id": "add", "continuation": "x", "finish_reason": "stop", "stats": {}}\n'
    output.write_text(kept)
    assert main(["generate", "--input", str(source), "--output", str(output), "--resume", "--no-progress"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("wedlm-hf generate: error: ") and "\n" not in error
    assert __import__("re").search(message, error), error
    assert output.read_text() == kept


def test_empty_input_gives_empty_output(tmp_path, capsys):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n")
    assert main(["generate", "--input", str(source), "--output", str(output)]) == 0
    assert output.exists() and output.read_text() == ""


def test_existing_output_needs_resume_or_overwrite(tmp_path, capsys):
    source = write_rows(tmp_path / "in.jsonl", ROWS[:1])
    output = tmp_path / "out.jsonl"
    output.write_text('{"id": "old"}\n')
    args = ["generate", "--input", str(source), "--output", str(output), "--no-progress", "--max-new-tokens", "4"]
    assert main(args) == 1 and "pass --resume" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 1 and "not in --input" in capsys.readouterr().err
    output.write_text('garbage\n{"id": "add"}\n')
    assert main(args + ["--resume"]) == 1 and "out.jsonl line 1: not a result line" in capsys.readouterr().err
    assert output.read_text() == 'garbage\n{"id": "add"}\n'
    assert main(args + ["--overwrite"]) == 0
    assert [r["id"] for r in read_output(output)] == ["add"]
    assert main(["generate", "a prompt", "--input", str(source), "--output", str(output)]) == 1
    assert "either a prompt or --input" in capsys.readouterr().err
    assert main(["generate", "a prompt", "--output", str(output)]) == 1
    assert "need --input" in capsys.readouterr().err


def test_cli_resume_after_a_torn_write(tmp_path, capsys, per_row):
    source = write_rows(tmp_path / "in.jsonl", ROWS)
    output = tmp_path / "out.jsonl"
    args = ["generate", "--input", str(source), "--output", str(output), "--max-new-tokens", str(NEW_TOKENS),
            "--batch-size", "2", "--no-progress"]
    assert main(args) == 0
    complete = output.read_text()
    check_against_per_row(read_output(output), per_row)
    lines = complete.splitlines(keepends=True)
    output.write_text(lines[4] + lines[1] + lines[5][:20])  # two rows done, then a write cut short by a kill
    assert main(args + ["--resume"]) == 0
    assert "5 rows generated" in capsys.readouterr().err and output.read_text() == complete
    assert main(args + ["--resume"]) == 0  # nothing left to do: a no-op
    assert "0 rows generated" in capsys.readouterr().err and output.read_text() == complete


def test_an_interrupted_job_says_how_to_resume(tmp_path, capsys, monkeypatch, per_row):
    """Ctrl-C mid-job: exit status 130 and one line naming --resume, which then finishes the file."""
    import wedlm_hf.batch

    source, output = write_rows(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    args = ["generate", "--input", str(source), "--output", str(output), "--max-new-tokens", str(NEW_TOKENS),
            "--batch-size", "2", "--no-progress"]
    real = wedlm_hf.batch.generate_in_rounds

    def interrupted_once_a_row_is_written(*arguments, **keywords):
        for finished, work in real(*arguments, **keywords):
            yield finished, work
            if finished:
                raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(wedlm_hf.batch, "generate_in_rounds", interrupted_once_a_row_is_written)
        assert main(args) == 130
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.endswith("keeps the rows finished so far: rerun with --resume to generate the rest")
    assert 0 < len(read_output(output)) < len(ROWS)
    assert main(args + ["--resume"]) == 0
    check_against_per_row(read_output(output), per_row)


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")



def test_cli_resume_after_killing_the_run(tmp_path):
    rows = [dict(row, id=f"{n}-{i}") for n in range(4) for i, row in enumerate(ROWS)]
    source = write_rows(tmp_path / "in.jsonl", rows)
    output, uninterrupted = tmp_path / "out.jsonl", tmp_path / "uninterrupted.jsonl"
    args = ["generate", "--input", str(source), "--max-new-tokens", str(NEW_TOKENS), "--batch-size", "1", "--no-progress"]
    process = subprocess.Popen([str(BIN / "wedlm-hf"), *args, "--output", str(output)], env=_env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline and process.poll() is None and _lines(output) < 3:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert 3 <= _lines(output) < len(rows), "the run should have been killed half way"
    assert main(args + ["--output", str(output), "--resume"]) == 0
    assert main(args + ["--output", str(uninterrupted)]) == 0
    assert output.read_text() == uninterrupted.read_text()
    assert len(read_output(output)) == len(rows)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_two_processes_equal_one(tmp_path, per_row):
    """`accelerate launch --num_processes 2` splits the rows and writes the same file as per-row generate.

    `--multi_gpu` selects accelerate's torchrun launcher, which is what starts two processes on a CPU-only machine
    (its `--cpu` launcher runs one process unless MPI is set up); the processes then form a gloo group."""
    source = write_rows(tmp_path / "in.jsonl", ROWS)
    output = tmp_path / "out.jsonl"
    command = [
        str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "wedlm_hf.cli", "generate", "--input", str(source), "--output", str(output),
        "--max-new-tokens", str(NEW_TOKENS), "--batch-size", "2", "--no-progress",
    ]
    run = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=PATIENCE_S)
    assert run.returncode == 0, run.stderr[-3000:]
    check_against_per_row(read_output(output), per_row)
    shares = run.stderr.strip().splitlines()[-1]
    counts = [int(part.split(": ")[1]) for part in shares.split("(")[1].split(")")[0].split(", ")]
    assert len(counts) == 2 and all(counts) and sum(counts) == len(ROWS), shares


def test_sampled_rows_are_the_same_at_any_batch_size(model_and_tokenizer):
    """On the engine a sampled row draws numbers keyed on itself (its key drawn in input order), so with a seed
    its text does not depend on the rows beside it."""
    model, tokenizer = model_and_tokenizer
    rows = [{"prompt": row["prompt"], "do_sample": True, "temperature": 1.3} for row in ROWS[:5]]
    rows.insert(2, {"prompt": ROWS[5]["prompt"]})  # greedy, between sampled rows
    texts = []
    for batch_size in (1, 4):
        torch.manual_seed(0)
        results = wedlm_hf.batch_generate(model, tokenizer, rows, batch_size=batch_size, max_new_tokens=NEW_TOKENS)
        texts.append([result["continuation"] for result in results])
    assert texts[0] == texts[1]
    greedy = wedlm_hf.batch_generate(model, tokenizer, [row["prompt"] for row in rows], max_new_tokens=NEW_TOKENS)
    assert texts[0][2] == greedy[2]["continuation"]
    assert sum(a != b["continuation"] for a, b in zip(texts[0], greedy)) >= 3, "temperature 1.3 sampled nothing"
