"""`wedlm-hf bench` end to end on tiny random models: every arm, table, JSON and PNG, sane agreements, and the
history arm drafting from the prompts answered before (the `repeated` set, also on the embedded checkpoint)."""

import argparse
import json
import time
from pathlib import Path

import pytest
import torch

from tiny_models import tiny_model, random_prompts
from wedlm_hf.bench import BenchConfig, build_arms, markdown, plot, run_bench, write_json
from wedlm_hf.bench.measure import ForwardCounter
from wedlm_hf.bench.runner import agreement
from wedlm_hf.cli import main

ALL_ARMS = {
    "ar", "prompt_lookup", "wedlm", "wedlm_blockwise", "wedlm_lossless", "wedlm_lossless_lookup",
    "wedlm_lossless_lookup_wide", "wedlm_lossless_history", "wedlm_lossless_sampled", "nocache",
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
    heading = "### forward cost model (cpu: the decoder prices with scale 24 tokens, premium 0, declared for cpu;"
    assert heading in table
    assert "| 32 | priced (scale 24, premium 0) | 1.00 |" in table
    assert "| measured |" not in table  # no profile: run_bench alone
    write_json(result, tmp_path / "bench.json")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {r["arm"] for r in data["sets"]["random"]} == ALL_ARMS
    plot(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("wedlm_lossless", "wedlm_lossless_lookup", "wedlm_lossless_lookup_wide", "wedlm_lossless_history"):
        assert rows[name].identical == 1.0, f"{name} must reproduce the ar arm exactly"
    for r in rows.values():
        assert r.tokens_per_s > 0 and r.forwards > 0 and len(r.tokens_per_s_repeats) == 2
        assert r.forward_ms > 0 and r.rest_ms > 0 and f"| {r.forward_ms:.2f} + {r.rest_ms:.2f} |" in table
        assert 0 <= r.token_match <= 1 and r.identical <= r.token_match + 1e-9


def test_the_forward_counter_times_the_forwards_alone():
    """The time it reports is spent inside the model's forward, not around it: the "model + rest" split."""

    class Sleeper(torch.nn.Module):
        def forward(self, input_ids):
            time.sleep(0.02)
            return input_ids

    model = Sleeper()
    with ForwardCounter(model) as counter:
        for width in (1, 3):
            model(torch.zeros(1, width))
            time.sleep(0.05)
    model(torch.zeros(1, 2))  # (after the block: not counted)
    assert (counter.calls, counter.fed) == (2, 4)
    assert 0.04 <= counter.seconds < 0.09


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


PRIMED = [[5, 6, 7, 8, 9], [10, 11, 12, 13], [20, 21, 22, 23, 24, 25]]
EDITED = [[5, 6, 7, 8, 30], [10, 11, 31, 13], [20, 21, 22, 23, 24, 32]]
"""Each primed prompt again with one token changed: what follows its unchanged n-grams is in the history."""


def test_history_arm_drafts_from_the_primed_prompts():
    """On a repeated set the history arm takes fewer forwards than every other arm, and still decodes AR's tokens;
    the primed decodes are not counted (counted, its forwards would exceed AR's). Unprimed, it drafts as the
    lookup arm does: its pass starts with an empty history (the warm-up's decode is not in it)."""
    config = BenchConfig(
        max_new_tokens=24, repeats=2, thresholds=(), scaling_lengths=(),
        families=("ar", "prompt_lookup", "wedlm_lossless", "wedlm_lossless_lookup", "wedlm_lossless_history"),
    )
    model = tiny_model("wedlm", seed=3, peak=6)
    result = run_bench(model, {"repeated": EDITED}, config, progress=False, primed={"repeated": PRIMED})
    rows = {r.arm: r for r in result.sets["repeated"]}
    assert all(r.identical == 1.0 for r in rows.values())
    history = rows.pop("wedlm_lossless_history")
    assert history.tokens_per_forward > max(r.tokens_per_forward for r in rows.values()), result.sets
    assert history.forwards < rows["ar"].forwards
    unprimed = run_bench(model, {"one": EDITED[:1]}, config, progress=False)
    plain = {r.arm: r for r in unprimed.sets["one"]}
    assert plain["wedlm_lossless_history"].tokens_per_forward == plain["wedlm_lossless_lookup"].tokens_per_forward
    with pytest.raises(ValueError, match="`primed` names sets not benchmarked: \\['other'\\]"):
        run_bench(model, {"repeated": EDITED}, config, progress=False, primed={"other": PRIMED})


def test_cli_repeated_set_primes_the_history_arm(tmp_path, capsys):
    """`--prompts repeated` on the embedded checkpoint: held-out code with a function renamed, after the
    originals went through the history arm, which then drafts from them; the output is still AR's."""
    from wedlm_hf.bench.prompts import repeated_prompts

    (original,), (edited,) = repeated_prompts(1)
    assert "_v0(" in edited and "_v0(" not in original  # its first function renamed
    json_path = tmp_path / "b.json"
    code = main([
        "bench", "--prompts", "repeated", "--arms", "ar,wedlm_lossless,wedlm_lossless_history", "--num-prompts", "1",
        "--max-new-tokens", "24", "--repeats", "1", "--thresholds", "", "--lengths", "", "--no-progress",
        "--json", str(json_path),
    ])
    assert code == 0 and "### prompts: repeated" in capsys.readouterr().out
    rows = {r["arm"]: r for r in json.loads(json_path.read_text())["sets"]["repeated"]}
    assert rows["wedlm_lossless_history"]["identical"] == rows["wedlm_lossless"]["identical"] == 1.0
    assert rows["wedlm_lossless_history"]["tokens_per_forward"] > rows["wedlm_lossless"]["tokens_per_forward"]


def test_a_new_arm_is_one_entry(monkeypatch):
    from wedlm_hf.bench import arms

    monkeypatch.setitem(arms.FAMILIES, "wedlm_lossless", {"decoding": "wedlm", "wedlm_lossless": True})
    monkeypatch.setattr(arms, "THRESHOLD_SWEPT", arms.THRESHOLD_SWEPT + ("wedlm_lossless",))
    names = [a.name for a in build_arms(("ar", "wedlm_lossless"), (0.3,))]
    assert names == ["ar", "wedlm_lossless", "wedlm_lossless@0.3"]
    with pytest.raises(ValueError, match="unknown arms"):
        build_arms(("nope",))


def test_cli_writes_table_json_and_png(tmp_path, capsys, monkeypatch):
    """Also the forward cost profile: measured and printed beside the scale the decoder prices with (the declared
    one), and with `--store-forward-cost` stored, so that the next run's decoder prices with it."""
    monkeypatch.setenv("WEDLM_HF_FORWARD_COST", str(tmp_path / "forward_cost.json"))
    json_path, png_path = tmp_path / "b.json", tmp_path / "b.png"
    argv = [
        "bench", "--model", "random", "--arms", "ar,wedlm", "--num-prompts", "1", "--max-new-tokens", "8",
        "--repeats", "1", "--thresholds", "none", "--lengths", "8", "--no-progress",
    ]
    code = main([*argv, "--json", str(json_path), "--plot", str(png_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "| wedlm@1slot |" in out and "| ar |" in out
    assert json.loads(json_path.read_text())["config"]["max_new_tokens"] == 8
    assert png_path.stat().st_size > 0
    assert "| 1 | measured | 1.00 |" in out
    assert "decoder prices with scale 24 tokens, premium 0, declared for cpu" in out
    assert not (tmp_path / "forward_cost.json").exists()
    assert main([*argv, "--arms", "ar", "--json", str(json_path), "--store-forward-cost"]) == 0
    cost = json.loads(json_path.read_text())["forward_cost"]
    scale, premium = cost["measured_scale"], cost["measured_premium"]
    assert f"decoder prices with scale {scale:g} tokens, premium {premium:g}, measured here" in capsys.readouterr().out
    assert (tmp_path / "forward_cost.json").exists()


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


TINY_RUN = [
    "--model", "random", "--arms", "ar,wedlm", "--num-prompts", "1", "--max-new-tokens", "8", "--repeats", "1",
    "--thresholds", "none", "--lengths", "8", "--no-progress",
]
"""Sizes that override all of `--quick`'s: its defaults for where the chart goes stay, the run takes seconds."""


def test_quick_writes_its_chart_where_the_readme_shows_it(tmp_path, monkeypatch, capsys):
    """`bench --quick` writes bench_quick.png and bench_quick.json, the names of the README's chart and its numbers
    in docs/, to the current folder; `--plot`/`--json` put them elsewhere, and then nothing lands there."""
    from wedlm_hf.commands.bench import QUICK

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"](docs/{QUICK['plot']})" in readme and f"`{QUICK['plot']}`" in readme
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick", *TINY_RUN]) == 0
    assert (tmp_path / QUICK["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / QUICK["json"]).read_text())["config"]["max_new_tokens"] == 8
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    chosen = ["--plot", str(tmp_path / "b.png"), "--json", str(tmp_path / "b.json")]
    assert main(["bench", "--quick", *TINY_RUN, *chosen]) == 0
    assert (tmp_path / "b.png").stat().st_size > 0 and (tmp_path / "b.json").exists()
    assert list(elsewhere.iterdir()) == []
    capsys.readouterr()


def test_a_model_not_trained_for_wedlm_runs_its_lossless_arms():
    """`--model smollm2` (no mask token): the lossless arms get one and still decode AR's tokens."""
    from wedlm_hf.bench.models import load_model

    model, tokenizer = load_model("smollm2")
    assert model.generation_config.mask_token_id == len(tokenizer) - 1
    config = BenchConfig(max_new_tokens=8, repeats=1, thresholds=(), scaling_lengths=(),
                         families=("ar", "wedlm_lossless_lookup"))
    result = run_bench(model, {"one": [tokenizer("def add(a, b):")["input_ids"]]}, config, progress=False)
    assert all(row.identical == 1.0 for row in result.sets["one"])
