"""`wedlm-hf generate --tp` under `torchrun`: transformers' tensor parallel (`tp_plan="auto"`) over 2 CPU processes
(gloo) gives the same rows as the unsharded model, for plain WeDLM with multi-slot steps and for lossless mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from patience import PATIENCE_S

import wedlm_hf
from wedlm_hf.cli import main

ROWS = [
    {"id": "a", "prompt": "def add(a, b):"},
    {"id": "b", "prompt": "import os\n", "wedlm_lossless": True},
    {"id": "c", "prompt": "class Foo:\n    def __init__(self):"},
    {"id": "d", "prompt": "x = [", "wedlm_lossless": True},
]


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    """A random Qwen3 (4 query / 2 KV heads, so 2-way sharding splits both) with the embedded tokenizer's vocab."""
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    tokenizer = AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, eos_token_id=0, pad_token_id=1,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # confident predictions, so a step fills several slots
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_tensor_parallel_equals_one_process(tiny_qwen3, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    args = ["generate", "--input", str(source), "--model", str(tiny_qwen3), "--mask-token-id", "2",
            "--threshold", "3.0", "--max-new-tokens", "16", "--no-progress"]
    assert main(args + ["--output", str(tmp_path / "one.jsonl")]) == 0
    one = tmp_path / "one.jsonl"
    forwards = [json.loads(line)["stats"]["forwards"] for line in one.read_text().splitlines()]
    assert min(forwards) < 16, "the test needs multi-slot steps to exercise the window feed on sharded heads"
    command = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
               "-m", "wedlm_hf.cli", *args, "--tp", "--output", str(tmp_path / "tp.jsonl")]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=PATIENCE_S)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "one model sharded over 2 processes" in run.stderr
    assert (tmp_path / "tp.jsonl").read_text() == one.read_text()


def test_tp_needs_several_processes(tiny_qwen3, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(ROWS[0]) + "\n")
    args = ["generate", "--input", str(source), "--output", str(tmp_path / "out.jsonl"), "--model", str(tiny_qwen3), "--tp"]
    assert main(args) == 1
    assert "torchrun --nproc_per_node" in capsys.readouterr().err
