"""`wedlm-hf bench` end to end on tiny random models: every arm, table, JSON and PNG, and sane agreements."""

import argparse
import json

import pytest
import torch

from tiny_models import tiny_model, random_prompts
from wedlm_hf.bench import BenchConfig, build_arms, markdown, plot, run_bench, write_json
from wedlm_hf.bench.runner import agreement
from wedlm_hf.cli import main

ALL_ARMS = {
    "ar", "prompt_lookup", "wedlm", "wedlm_blockwise", "wedlm_lossless", "wedlm_lossless_lookup",
    "wedlm_lossless_sampled", "nocache",
    "wedlm@1slot", "wedlm@0.5", "wedlm_blockwise@1slot", "wedlm_blockwise@0.5",
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """On a busy shared machine multi-threaded torch spin-waits (docs/benchmarks.md); the CLI sets 1 too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def result():
    input_ids, _ = random_prompts([6, 9], seed=3)
    prompts = [row[row != 0].tolist() for row in input_ids]
    config = BenchConfig(max_new_tokens=12, repeats=2, thresholds=(None, 0.5), scaling_lengths=(8, 16))
    return run_bench(tiny_model("wedlm"), {"random": prompts}, config, progress=False)


def test_every_arm_is_reported(result, tmp_path):
    rows = {r.arm: r for r in result.sets["random"]}
    assert set(rows) == ALL_ARMS
    table = markdown(result)
    assert all(f"| {name} |" in table for name in ALL_ARMS)
    write_json(result, tmp_path / "bench.json")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {r["arm"] for r in data["sets"]["random"]} == ALL_ARMS
    plot(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("wedlm_lossless", "wedlm_lossless_lookup"):
        assert rows[name].identical == 1.0, f"{name} must reproduce the ar arm exactly"
    for r in rows.values():
        assert r.tokens_per_s > 0 and r.forwards > 0 and len(r.tokens_per_s_repeats) == 2
        assert 0 <= r.token_match <= 1 and r.identical <= r.token_match + 1e-9


def test_agreements_are_sane(result):
    rows = {r.arm: r for r in result.sets["random"]}
    assert rows["ar"].identical == rows["ar"].token_match == rows["ar"].speedup == 1.0
    assert rows["ar"].p_cache == pytest.approx(1.0)
    assert rows["prompt_lookup"].identical == 1.0  # greedy prompt lookup is lossless
    assert rows["nocache"].outputs == rows["wedlm"].outputs  # the reference decodes the same tokens
    for name in ("wedlm@1slot", "wedlm_blockwise@1slot"):
        assert rows[name].tokens_per_forward <= 1.0  # one slot per step
    assert agreement(rows["wedlm@1slot"].outputs, rows["wedlm@1slot"].outputs) == (1.0, 1.0)
    assert agreement([[1, 2, 3]], [[1, 2, 4, 5]]) == (0.0, 0.5)


def test_time_vs_length_covers_the_scaling_arms(result):
    assert set(result.scaling) == {"ar", "wedlm", "nocache"}
    assert all(set(by_length) == {8, 16} for by_length in result.scaling.values())


def test_a_new_arm_is_one_entry(monkeypatch):
    from wedlm_hf.bench import arms

    monkeypatch.setitem(arms.FAMILIES, "wedlm_lossless", {"decoding": "wedlm", "wedlm_lossless": True})
    monkeypatch.setattr(arms, "THRESHOLD_SWEPT", arms.THRESHOLD_SWEPT + ("wedlm_lossless",))
    names = [a.name for a in build_arms(("ar", "wedlm_lossless"), (0.3,))]
    assert names == ["ar", "wedlm_lossless", "wedlm_lossless@0.3"]
    with pytest.raises(ValueError, match="unknown arms"):
        build_arms(("nope",))


def test_cli_writes_table_json_and_png(tmp_path, capsys):
    json_path, png_path = tmp_path / "b.json", tmp_path / "b.png"
    code = main([
        "bench", "--model", "random", "--arms", "ar,wedlm", "--num-prompts", "1", "--max-new-tokens", "8",
        "--repeats", "1", "--thresholds", "none", "--lengths", "8", "--no-progress",
        "--json", str(json_path), "--plot", str(png_path),
    ])
    assert code == 0
    out = capsys.readouterr().out
    assert "| wedlm@1slot |" in out and "| ar |" in out
    assert json.loads(json_path.read_text())["config"]["max_new_tokens"] == 8
    assert png_path.stat().st_size > 0


def test_compile_flag_adds_compiled_arms(tmp_path, capsys):
    """`--compile BACKEND` adds ar_compiled and wedlm_compiled, both really compiled (a registered pass-through
    backend counts the graphs, so no C++ compiler is needed), and decoding the same tokens as their eager arms."""
    from torch._dynamo import register_backend

    graphs = []

    @register_backend(name="wedlm_test_counting")
    def counting(graph_module, example_inputs):
        graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return graph_module.forward

    torch._dynamo.reset()
    json_path = tmp_path / "b.json"
    code = main([
        "bench", "--model", "random", "--arms", "ar,wedlm", "--num-prompts", "2", "--max-new-tokens", "8",
        "--repeats", "1", "--thresholds", "", "--lengths", "", "--no-progress", "--compile", "wedlm_test_counting",
        "--json", str(json_path),
    ])
    torch._dynamo.reset()
    assert code == 0
    out = capsys.readouterr().out
    assert "| ar_compiled |" in out and "| wedlm_compiled |" in out
    data = json.loads(json_path.read_text())
    assert data["config"]["compile_backend"] == "wedlm_test_counting"
    rows = {r["arm"]: r for r in data["sets"]["random"]}
    assert rows["ar_compiled"]["outputs"] == rows["ar"]["outputs"]
    assert rows["wedlm_compiled"]["outputs"] == rows["wedlm"]["outputs"]
    shapes = {shape for inputs in graphs for shape in inputs}
    assert (1, 1) in shapes and (1, 32) in shapes, "compiled steps: AR feeds 1 token per row, WeDLM 2W = 32"


def test_quick_fills_only_the_sizes_not_given():
    from wedlm_hf.commands.bench import FULL, QUICK, apply_sizes, register

    parser = argparse.ArgumentParser()
    register(parser)
    args = parser.parse_args(["--quick", "--num-prompts", "1", "--thresholds", "none"])
    apply_sizes(args)
    assert (args.num_prompts, args.thresholds, args.max_new_tokens) == (1, "none", QUICK["max_new_tokens"])
    args = parser.parse_args(["--repeats", "5"])
    apply_sizes(args)
    assert (args.repeats, args.lengths) == (5, FULL["lengths"])
