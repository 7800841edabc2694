"""The dual-stream training objective (spec §6): attention pattern, reordering, loss, and a `Trainer` run."""

import json
import math

import pytest
import torch
from default_decoding_check import shown_right, written_default
from tiny_models import MASK_ID, tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from wedlm_hf.training import (
    DualStreamCollator,
    WeDLMTrainer,
    dual_stream_attention_mask,
    dual_stream_loss,
    dual_stream_visibility,
    train_tokenizer,
)
from wedlm_hf.cli import main as wedlm_hf_cli
from wedlm_hf.bench.prompts import stdlib_files
from wedlm_hf.training.corpus import low_entropy_documents, pack


def batch_of(rows: torch.Tensor, **options) -> dict:
    collator = DualStreamCollator(MASK_ID, seed=options.pop("seed", 0), **options)
    return collator([{"input_ids": row} for row in rows])


def test_visibility_hand_checked():
    # L=4, B=2: memory 0..3 causal; prediction block 0 (slots 4,5) sees no memory, block 1 (6,7) sees memory 0,1.
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],
            [0, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 0, 1, 0],
            [1, 1, 0, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(dual_stream_visibility(4, 2), expected)


def test_visibility_ragged_last_block():
    # L=5, B=2: the last block is the single slot 4 (physical 9); it sees memory 0..3 and itself only.
    visible = dual_stream_visibility(5, 2)
    assert visible[9].nonzero().flatten().tolist() == [0, 1, 2, 3, 9]
    assert visible[7].nonzero().flatten().tolist() == [0, 1, 7]  # block 1, second slot
    assert not visible[:5, 5:].any()  # memory never sees the prediction stream


def test_additive_mask_matches_visibility():
    mask = dual_stream_attention_mask(6, 4)
    assert mask.shape == (1, 1, 12, 12)
    assert torch.equal(mask[0, 0] == 0, dual_stream_visibility(6, 4))
    assert (mask[0, 0][~dual_stream_visibility(6, 4)] == torch.finfo(torch.float32).min).all()


def test_collator_reorders_blocks_and_labels():
    length, block = 24, 8
    x0 = torch.randint(3, 90, (16, length), generator=torch.Generator().manual_seed(1))
    batch = batch_of(x0, block_size=block, ar_weight=0.5)
    assert batch["input_ids"].shape == batch["position_ids"].shape == (16, 2 * length)
    assert batch["attention_mask"].shape == (16, 1, 2 * length, 2 * length)
    assert torch.equal(batch["input_ids"][:, :length], x0)
    assert torch.equal(batch["position_ids"][:, :length], torch.arange(length).expand(16, -1))
    assert torch.equal(batch["labels"][:, : length - 1], x0[:, 1:])
    assert (batch["labels"][:, length - 1] == -100).all()
    for row in range(16):
        stream = batch["input_ids"][row, length:]
        positions = batch["position_ids"][row, length:]
        labels = batch["labels"][row, length:]
        weights = batch["loss_weights"][row, length:]
        for start in range(0, length, block):
            ids, pos = stream[start : start + block], positions[start : start + block]
            is_mask = ids == MASK_ID
            masks = int(is_mask.sum())
            assert 1 <= masks <= block
            assert not is_mask[: block - masks].any()  # observed first, masks last
            assert sorted(pos.tolist()) == list(range(start, start + block))  # a permutation inside the block
            observed, masked = pos[~is_mask], pos[is_mask]
            assert torch.equal(observed, observed.sort().values) and torch.equal(masked, masked.sort().values)
            assert torch.equal(ids[~is_mask], x0[row, observed])  # observed tokens are the true ones
            assert torch.equal(labels[start : start + block][is_mask], x0[row, masked])  # own-position target
            assert (labels[start : start + block][~is_mask] == -100).all()
            assert torch.allclose(weights[start : start + block][is_mask], torch.tensor(block / masks / length))


def test_collator_mask_share_is_spread():
    batch = batch_of(torch.randint(3, 90, (64, 32)), block_size=32, suffix_prob=0.0)
    counts = (batch["input_ids"][:, 32:] == MASK_ID).sum(dim=1)
    assert counts.min() <= 4 and counts.max() >= 28  # g ~ U{1..B}/B, not a fixed rate


def test_loss_matches_direct_computation():
    torch.manual_seed(0)
    length, block, ar_weight = 12, 4, 0.3
    x0 = torch.randint(3, 90, (3, length))
    batch = batch_of(x0, block_size=block, ar_weight=ar_weight)
    logits = torch.randn(3, 2 * length, 96)
    loss, parts = dual_stream_loss(logits, batch["labels"], batch["loss_weights"])

    log_probs = logits.log_softmax(-1)
    total_mdm = total_ar = 0.0
    for row in range(3):
        ar = -sum(log_probs[row, i, x0[row, i + 1]] for i in range(length - 1)) / (length - 1)
        mdm = 0.0
        for slot in range(length):
            if batch["input_ids"][row, length + slot] == MASK_ID:
                start = slot // block * block
                g = (batch["input_ids"][row, length + start : length + start + block] == MASK_ID).float().mean()
                position = batch["position_ids"][row, length + slot]
                mdm -= log_probs[row, length + slot, x0[row, position]] / g
        total_mdm += mdm / length
        total_ar += ar
    assert loss.item() == pytest.approx((total_mdm + ar_weight * total_ar).item() / 3, rel=1e-5)
    assert parts["mdm"] == pytest.approx(total_mdm.item() / 3, rel=1e-5)
    assert parts["ar"] == pytest.approx(total_ar.item() / 3, rel=1e-5)


@pytest.mark.parametrize("family", ["wedlm", "llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_dual_stream_forward(family, attn):
    """Memory logits equal a plain causal forward; each prediction slot equals a direct forward of what it sees."""
    model = tiny_model(family, attn=attn)
    length, block = 12, 4
    x0 = torch.randint(3, 90, (2, length), generator=torch.Generator().manual_seed(2))
    batch = batch_of(x0, block_size=block, seed=3)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
        ).logits
        torch.testing.assert_close(logits[:, :length], model(input_ids=x0).logits, atol=1e-4, rtol=1e-4)
        # block 1 of row 0, fed as its own sequence: memory prefix 0..3, then the reordered block at its positions
        row, start = 0, block
        ids = torch.cat([x0[row, :start], batch["input_ids"][row, length + start : length + start + block]])
        block_positions = batch["position_ids"][row, length + start : length + start + block]
        positions = torch.cat([torch.arange(start), block_positions])
        direct = model(input_ids=ids[None], position_ids=positions[None], attention_mask=torch.ones(1, len(ids))).logits
        torch.testing.assert_close(
            logits[row, length + start : length + start + block], direct[0, start:], atol=1e-4, rtol=1e-4
        )


def test_trainer_runs_and_learns(tmp_path):
    model = tiny_model("wedlm").train()
    rows = torch.randint(3, 90, (4, 16), generator=torch.Generator().manual_seed(4)).repeat(4, 1)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
    )
    collator = DualStreamCollator(MASK_ID, block_size=8, seed=0)
    dataset = [{"input_ids": row} for row in rows]
    trainer = WeDLMTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    before = model.lm_head.weight.detach().clone()
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert not torch.equal(before, model.lm_head.weight)


def test_tokenizer_round_trip(tmp_path):
    texts = ["def add(a, b):\n    return a + b\n"] * 20 + low_entropy_documents(20, seed=0)
    tokenizer = train_tokenizer(texts, vocab_size=300)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|pad|>", "<|mask|>"]
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.mask_token_id) == (0, 1, 2)
    text = "x = [10, 11, 12]\n    return a + b"
    ids = loaded(text)["input_ids"]
    assert loaded.decode(ids) == text
    assert "1" in loaded.convert_ids_to_tokens(ids) and "10" not in loaded.convert_ids_to_tokens(ids)  # digit split
    packed = pack(texts[:3], loaded, 8)
    assert packed.shape[1] == 8 and (packed == loaded.eos_token_id).sum() >= 1


def test_corpus_split_is_deterministic_and_disjoint():
    train, held_out = stdlib_files("train"), stdlib_files("eval")
    assert held_out and len(held_out) < len(train) // 5
    assert not set(train) & set(held_out)
    assert held_out == stdlib_files("eval")
    assert low_entropy_documents(5, seed=7) == low_entropy_documents(5, seed=7)


def test_train_command_writes_a_checkpoint_that_decodes(tmp_path):
    """`wedlm-hf train` end to end, shrunk: tokenizer, corpus rows, steps, held-out evals, logs, plot, and a
    checkpoint that loads through the Auto classes and decodes with WeDLM by default: the decoding its end-of-run
    evaluation shows right, plain at the given threshold alone (`--threshold`, the old spelling, still works)."""
    output = tmp_path / "checkpoint"
    options = {
        "--output-dir": output, "--steps": 3, "--batch-size": 2, "--seq-len": 32, "--code-chars": 100_000,
        "--vocab-size": 300, "--hidden-size": 64, "--layers": 1, "--intermediate-size": 128, "--eval-every": 2,
        "--save-every": 2, "--threads": 1, "--threshold": 0.6,
    }
    assert wedlm_hf_cli(["train", *(str(item) for pair in options.items() for item in pair)]) == 0
    log = json.loads((output / "training_log.json").read_text())
    assert log["steps_done"] == 3 and log["parameters"] > 0
    evaluation = json.loads((output / "evaluation.json").read_text())
    assert evaluation["settings"]["thresholds"] == [0.6]
    assert {row["domain"] for row in evaluation["rows"]} == {"held-out code", "counting"}
    expected = shown_right(output)
    assert written_default(output, expected) == expected == log["default_decoding"]["keywords"]
    config = json.loads((output / "generation_config.json").read_text())
    assert (config["wedlm_entropy_threshold"], config["wedlm_pos_penalty_factor"]) == (0.6, 0.02)  # the table's
    assert [r["step"] for r in log["log"] if r["split"] == "eval"] == [2, 3]
    assert all(math.isfinite(r["mdm"]) and math.isfinite(r["ar"]) for r in log["log"])
    assert (output / "loss_curves.png").stat().st_size > 0 and (output / "loss_curves.csv").exists()

    tokenizer = AutoTokenizer.from_pretrained(output)
    model = AutoModelForCausalLM.from_pretrained(output)
    assert tokenizer.convert_tokens_to_ids("<|mask|>") == model.config.mask_token_id
    inputs = tokenizer("1, 2, 3, ", return_tensors="pt")
    output_ids = model.generate(**inputs, max_new_tokens=5, eos_token_id=None, return_dict_in_generate=True)
    assert output_ids.sequences.shape[1] == inputs["input_ids"].shape[1] + 5
    assert output_ids.wedlm_stats.total_generated == 5  # generation_config.json selects WeDLM


def test_train_without_evaluation_writes_lossless(tmp_path):
    """`--no-evaluate` and no mode flag: lossless, since nothing showed plain right (the same rule as finetune's)."""
    output = tmp_path / "checkpoint"
    options = {
        "--output-dir": output, "--steps": 1, "--batch-size": 2, "--seq-len": 32, "--code-chars": 50_000,
        "--vocab-size": 300, "--hidden-size": 64, "--layers": 1, "--intermediate-size": 128, "--threads": 1,
        "--penalty": 0.05,
    }
    assert wedlm_hf_cli(["train", *(str(item) for pair in options.items() for item in pair), "--no-evaluate"]) == 0
    assert not (output / "evaluation.json").exists()
    log = json.loads((output / "training_log.json").read_text())
    assert log["default_decoding"]["keywords"] == {"wedlm_lossless": True} and "not evaluated" in log["default_decoding"]["reason"]
    config = json.loads((output / "generation_config.json").read_text())
    assert (config["wedlm_lossless"], config["wedlm_entropy_threshold"], config["wedlm_pos_penalty_factor"]) == (True, 0.4, 0.05)
