"""`wedlm-hf`: options of `generate`, `--help` without torch, and one-line errors from every subcommand."""

import argparse
import importlib
import io
import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch
from transformers.cli.serving import model_manager

import wedlm_hf
from wedlm_hf.commands.generate import read_prompt
from wedlm_hf.commands.placement import default_threads
from wedlm_hf.generation.transformers_version import INSTALLED, SERVING_RELEASES
from wedlm_hf_cli import SUBCOMMANDS, main

PROMPT = "1, 2, 3, 4,"
SERVE_REFUSED = (
    None if SERVING_RELEASES[0] <= INSTALLED <= SERVING_RELEASES[1] else "WeDLM serving (built on transformers serve's classes) runs on"
)
"""How `wedlm-hf serve` begins its one-line error on a transformers older than its serving classes need."""


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, *argv) -> tuple[str, str]:
    """The continuation and the stats line of a successful `wedlm-hf generate`."""
    code, out, err = run_cli(capsys, "generate", *argv)
    assert code == 0, err
    text, stats = out.rsplit("\n", 2)[:2]
    return text, stats


def test_help_and_version_import_no_torch():
    script = (
        "import sys\nfrom wedlm_hf_cli import main\n"
        "for argv in (['--help'], ['--version']):\n"
        "    try:\n        main(argv)\n    except SystemExit as exit:\n        assert exit.code == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'wedlm_hf') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "generate" in result.stdout and "serve" in result.stdout  # the command list of --help
    assert f"wedlm-hf {version('wedlm-hf')}" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_subcommand_has_help_with_defaults(command, capsys):
    with pytest.raises(SystemExit) as exit:
        main([command, "--help"])
    assert exit.value.code == 0
    assert "--debug" in capsys.readouterr().out


def help_lines(capsys, monkeypatch, *argv) -> list[str]:
    """`--help` of `argv`, one line per option (a terminal wide enough that no help text wraps)."""
    monkeypatch.setenv("COLUMNS", "10000")
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--help"])
    assert exit.value.code == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_help_states_each_default_once_and_never_none(command, capsys, monkeypatch):
    lines = help_lines(capsys, monkeypatch, command)
    doubled = [line for line in lines if len(re.findall(r"default:|\(default ", line)) > 1]
    assert doubled == []
    assert [line for line in lines if re.search(r"\bNone\b", line)] == []
    if command in ("serve", "demo"):
        assert any(re.search(r"--port PORT .*\(default: \d+\)", line) for line in lines), lines


def test_top_level_help_names_the_batch_mode(capsys, monkeypatch):
    assert any("generate --input" in line for line in help_lines(capsys, monkeypatch))


def test_generate_help_shows_library_and_checkpoint_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 128)" in text  # --max-new-tokens
    assert "embedded checkpoint: 1.0), else the library default 0.4" in text
    assert "embedded checkpoint: 0.05), else the library default 0.02" in text


def test_prompt_escapes_stdin_and_file(tmp_path, monkeypatch):
    def namespace(prompt, prompt_file=None):
        return argparse.Namespace(prompt=prompt, prompt_file=prompt_file)

    assert read_prompt(namespace(r"def f():\n\treturn 1 \\n")) == "def f():\n\treturn 1 \\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("a\\nb\n"))
    assert read_prompt(namespace("-")) == "a\\nb"  # as is, but for the newline `echo` ends it with
    monkeypatch.setattr(sys, "stdin", io.StringIO("def f():\n\n"))
    assert read_prompt(namespace("-")) == "def f():\n"  # one newline only
    (tmp_path / "prompt.txt").write_text("x = 1\n")
    assert read_prompt(namespace(None, tmp_path / "prompt.txt")) == "x = 1\n"


def test_stdin_prompt_gives_the_argument_prompt_output(capsys, monkeypatch):
    expected = generate(capsys, PROMPT, "--max-new-tokens", "12")
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert generate(capsys, "-", "--max-new-tokens", "12")[0] == expected[0]
    assert expected[1].startswith("[wedlm] 12 tokens in ")


def test_echo_into_stdin_gives_the_argument_prompt_output(capsys):
    expected = generate(capsys, PROMPT, "--max-new-tokens", "6")
    result = subprocess.run(
        f"echo '{PROMPT}' | {sys.executable} -m wedlm_hf.cli generate - --max-new-tokens 6",
        shell=True, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rsplit("\n", 2)[0] == expected[0]


@pytest.mark.parametrize("mode", [[], ["--ar"]])
def test_stats_line_ends_with_why_decoding_stopped(mode, capsys):
    # the embedded tokenizer writes a newline and the indentation after it as one token: after the bare newline
    # token the model ends the text at once, which the stats line now says
    text, stats = generate(capsys, r"def fib(n):\n", *mode)
    assert text == "" and "] 1 token in " in stats and stats.endswith("end-of-text token (eos)"), stats
    text, stats = generate(capsys, r"def fib(n):\n    ", "--max-new-tokens", "5", *mode)
    assert "] 5 tokens in " in stats and stats.endswith("stopped at --max-new-tokens (length)"), stats


STATS_LINE = re.compile(
    r"\[wedlm\] (\d+) tokens in (\d+) forwards: (\d+\.\d\d) tokens per forward \(ordinary decoding: 1\); "
    r"(\d+) of (\d+) guessed tokens accepted; (\d+)% of the tokens fed to the model became output \(p_cache\); "
    r"\d+\.\d tokens/s; stopped at --max-new-tokens \(length\)"
)


def test_stats_line_reads_in_words_and_help_explains_it(capsys, monkeypatch):
    """A newcomer reads the line without a glossary: counts in words, what ordinary decoding makes beside tokens
    per forward; `--help` says what a forward and tokens per forward are."""
    _, stats = generate(capsys, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "--lossless", "--max-new-tokens", "32")
    match = STATS_LINE.fullmatch(stats)
    assert match, stats
    tokens, forwards, per_forward, accepted, drafted, _ = match.groups()
    assert int(tokens) == 32 and float(per_forward) == pytest.approx(32 / int(forwards), abs=0.005)
    assert 0 < int(accepted) <= int(drafted)
    text = " ".join(help_lines(capsys, monkeypatch, "generate"))
    assert "tokens per forward, how many tokens each call produced (ordinary decoding, --ar, makes 1)" in text


def test_a_device_this_machine_lacks_is_one_line_naming_cpu(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    (tmp_path / "in.jsonl").write_text('{"prompt": "x"}\n')
    batch = ["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]
    for argv, line in [
        (["generate", "x", "--device", "cuda"], "--device cuda: this torch has no CUDA or sees no CUDA device; use "
         "--device cpu"),
        (["generate", "x", "--device", "mps"], "--device mps: Apple's MPS backend is not available on this machine; "
         "use --device cpu"),
        (["generate", *batch, "--device", "cuda:0"], "--device cuda:0: this torch has no CUDA"),
        (["serve", "--device", "cuda", "--port", "1"], SERVE_REFUSED or "--device cuda: this torch has no CUDA"),
    ]:
        code, _, err = run_cli(capsys, *argv)
        assert code == 1 and err.startswith(f"wedlm-hf {argv[0]}: error: {line}") and err.count("\n") == 1, err


def test_lossless_equals_ar_and_stream_equals_print(capsys):
    ar_text, ar_stats = generate(capsys, "def add(a, b):\n", "--ar", "--max-new-tokens", "24")
    lossless_text, lossless_stats = generate(capsys, "def add(a, b):\n", "--lossless", "--max-new-tokens", "24")
    assert lossless_text == ar_text
    assert ar_stats.startswith("[ar]") and lossless_stats.startswith("[wedlm]")
    streamed, _ = generate(capsys, "def add(a, b):\n", "--lossless", "--max-new-tokens", "24", "--stream")
    assert streamed == ar_text


@pytest.mark.parametrize("flags,lossless", [((), None), (("--lossless",), True), (("--plain",), False)])
def test_mode_flags_set_lossless_or_leave_it_to_the_generation_config(flags, lossless):
    from wedlm_hf.commands.generate import generation_options
    from wedlm_hf_cli import build_parser

    argv = ["generate", "x", *flags]
    options = generation_options(build_parser(argv).parse_args(argv))
    assert options["decoding"] == "wedlm" and options.get("wedlm_lossless") is lossless


def test_plain_overrides_a_lossless_generation_config(capsys, tmp_path):
    """A model whose generation config defaults to lossless (as the shipped SmolLM2 adapter's does) decodes
    exactly greedy by default, and `--plain` gives plain WeDLM's parallel commits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(wedlm_hf.DEFAULT_MODEL)
    model.generation_config.wedlm_lossless = True
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(wedlm_hf.DEFAULT_MODEL).save_pretrained(tmp_path)
    counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"
    common = ("--model", str(tmp_path), "--max-new-tokens", "32")
    greedy, _ = generate(capsys, counting, "--ar", *common)
    default, default_stats = generate(capsys, counting, *common)
    _, plain_stats = generate(capsys, counting, "--plain", *common)
    assert default == greedy and "guessed tokens accepted" in default_stats
    assert "accepted" not in plain_stats


def test_chat_applies_the_template(capsys):
    # the embedded template is the messages' text, so one user message continues like the plain prompt
    chat = generate(capsys, PROMPT, "--chat", "--max-new-tokens", "8")[0]
    assert chat == generate(capsys, PROMPT, "--max-new-tokens", "8")[0]


def test_seeded_sampling_and_placement(capsys):
    options = ("--do-sample", "--temperature", "0.9", "--top-p", "0.95", "--seed", "7", "--max-new-tokens", "12")
    first, _ = generate(capsys, "import", *options)
    assert generate(capsys, "import", *options)[0] == first
    text, stats = generate(capsys, PROMPT, "--dtype", "bfloat16", "--device", "cpu", "--max-new-tokens", "8")
    assert stats.startswith("[wedlm] 8 tokens in ")


MODEL_COMMANDS = {  # every command that runs a model, with the arguments it cannot do without
    "generate": ["x"],
    "generate --input": ["--input", "in.jsonl", "--output", "out.jsonl"],
    "serve": [],
    "demo": [],
    "bench": [],
    "evaluate": [],
    "train": [],
    "finetune": ["model", "--data", "rows.jsonl", "--output-dir", "out"],
}


@pytest.fixture
def threads_seen(monkeypatch):
    """Runs a command whose `run` only records torch's thread count (and `args.threads`) when it is called."""
    original = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def seen(command: str, *flags: str) -> tuple[int, int]:
        name = command.split()[0]
        calls = []
        module = importlib.import_module(SUBCOMMANDS[name][0])
        monkeypatch.setattr(module, "run", lambda args: calls.append((torch.get_num_threads(), args.threads)))
        torch.set_num_threads(7)  # neither the rule's value nor any the tests pass
        assert main([name, *MODEL_COMMANDS[command], *flags]) == 0
        return calls[0]

    yield seen
    torch.set_num_threads(original)


@pytest.mark.parametrize("command", list(MODEL_COMMANDS))
def test_threads_reach_torch_in_every_model_command(command, threads_seen, monkeypatch):
    assert threads_seen(command, "--threads", "3") == (3, 3)
    assert threads_seen(command) == (default_threads(), default_threads())
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own setting wins over the default rule
    assert threads_seen(command) == (2, 2)
    assert threads_seen(command, "--threads", "1") == (1, 1)  # and the flag over it


def test_default_threads_leave_half_the_cores_and_at_most_four(monkeypatch):
    assert [default_threads(cores) for cores in (1, 2, 3, 4, 8, 32, 128)] == [1, 1, 1, 2, 4, 4, 4]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    assert default_threads() == 3  # the cores this process may use, not the machine's


def test_bad_omp_num_threads_is_one_line(threads_seen, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    code, _, err = run_cli(capsys, "generate", "x")
    assert code == 1
    assert err == "wedlm-hf generate: error: OMP_NUM_THREADS must be an integer >= 1; got 'many': fix or unset it, " \
        "or pass --threads N\n"


@pytest.fixture
def exported(tmp_path, capsys):
    assert main(["export", str(tmp_path / "export"), "--config", "WeDLM-7B-Base"]) == 0
    return tmp_path / "export"


USER_ERRORS = [
    (["generate", ""], "the prompt is empty"),
    (["generate", "--ar", ""], "the prompt is empty"),
    (["generate"], "no prompt"),
    (["generate", "x", "--window-size", "0"], "--window-size: must be an integer >= 1; got '0'"),
    (["generate", "x", "--entropy-threshold", "-1"], "must be a number >= 0, or 'none' for one slot per step; got '-1'"),
    (["bench", "--arms", "foo"], "unknown arms ['foo']"),
    (["generate", "x", "--max-new-tokens", "5000"], "shorten the prompt or lower --max-new-tokens"),
    (["generate", "x", "--ar", "--max-new-tokens", "5000"], "shorten the prompt or lower --max-new-tokens"),
    (["generate", "x", "--temperature", "0.5"], "add --do-sample"),
    (["generate", "x", "--ar", "--threshold", "0.3"], "--ar turns off"),
    (["generate", "x", "--model", "/no/such/model"], "no such folder"),
    (["generate", "x", "--device", "nowhere"], "--device"),
    (["generate", "x", "--threads", "0"], "--threads: must be an integer >= 1; got '0'"),
    (["bench", "--threads", "-2"], "--threads: must be an integer >= 1; got '-2'"),
    (["finetune", "m", "--data", "d", "--output-dir", "o", "--threads", "two"], "--threads: must be an integer >= 1"),
    (["bench", "--thresholds", "high", "--num-prompts", "1", "--lengths", ""], "high"),
    (["export", "{tmp}/out", "--model", "{tmp}/missing"], "missing"),
    (["export", "{tmp}", "--config", "WeDLM-7B-Base"], "is not empty: pass --overwrite"),
    (["push", "{tmp}", "--repo-id", "me/x"], "not an exported folder"),
    (["train", "--output-dir", "{tmp}/file/checkpoint", "--threads", "1"], "file"),
    (["serve", "{tmp}/missing", "--port", "1"], SERVE_REFUSED or "missing"),
    (["demo", "--concurrency", "0"], "--concurrency"),
]


@pytest.mark.parametrize("argv,message", USER_ERRORS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_user_error_is_one_line_without_traceback(argv, message, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    original = model_manager.ModelManager
    code, out, err = run_cli(capsys, *(word.format(tmp=tmp_path) for word in argv))
    assert model_manager.ModelManager is original  # a `serve` that failed leaves transformers as it found it
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"wedlm-hf {argv[0]}: error: ") and message in err


def test_missing_extra_names_the_install_command(capsys, monkeypatch):
    monkeypatch.setitem(SUBCOMMANDS, "demo", ("wedlm_hf_test_absent_module", "help", "demo"))
    code, _, err = run_cli(capsys, "demo")
    assert code == 1
    assert err == (
        "wedlm-hf demo: error: `wedlm-hf demo` needs the package 'wedlm_hf_test_absent_module': "
        "pip install 'wedlm-hf[demo]'\n"
    )


def test_export_writes_over_a_folder_only_with_overwrite(exported, capsys):
    (exported / "notes.txt").write_text("mine")
    (exported / "config.json").write_text("{}")
    assert main(["export", str(exported), "--config", "WeDLM-7B-Base"]) == 1
    assert (exported / "config.json").read_text() == "{}"  # refused before anything was written
    assert main(["export", str(exported), "--config", "WeDLM-7B-Base", "--overwrite"]) == 0
    assert "auto_map" in (exported / "config.json").read_text() and (exported / "notes.txt").read_text() == "mine"


def test_push_without_network_is_one_line(exported):
    result = subprocess.run(
        [sys.executable, "-m", "wedlm_hf.cli", "push", str(exported), "--repo-id", "me/x"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_unused"},
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "cannot reach the Hugging Face Hub" in result.stderr


def test_push_to_an_unreachable_hub_is_one_line(exported):
    result = subprocess.run(
        [sys.executable, "-m", "wedlm_hf.cli", "push", str(exported), "--repo-id", "me/x"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:1", "HF_TOKEN": "hf_unused"},
    )
    assert result.returncode == 1
    assert result.stderr.startswith("wedlm-hf push: error: cannot reach the Hugging Face Hub at http://127.0.0.1:1 (")
    assert result.stderr.count("\n") == 1, result.stderr


def test_demo_prints_its_address_and_no_share_hint(capsys, monkeypatch):
    """`wedlm-hf demo` as a user starts it, stopped where it would wait for Ctrl-C: one line with the address, none
    of Gradio's start-up lines (they suggest `share=True`, which the command cannot act on)."""
    gradio = pytest.importorskip("gradio")
    from local_server import free_port

    served = []

    def stop_instead_of_waiting(app):
        served.append(app.local_url)
        app.close()

    monkeypatch.setattr(gradio.Blocks, "block_thread", stop_instead_of_waiting)
    port = free_port()
    code, out, err = run_cli(capsys, "demo", "--port", str(port))
    assert code == 0, err
    assert served == [f"http://127.0.0.1:{port}/"]
    assert out.splitlines()[0] == f"demo on http://127.0.0.1:{port}/ (Ctrl-C stops)"  # then the test's close
    assert "share" not in out + err and "Running on" not in out


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(ValueError, match="the prompt is empty"):
        main(["generate", "", "--debug"])
    with pytest.raises(ValueError, match="the prompt is empty"):
        main(["--debug", "generate", ""])


def test_console_script_error_exit_status():
    result = subprocess.run(
        [sys.executable, "-m", "wedlm_hf.cli", "generate", "", "--model", wedlm_hf.DEFAULT_MODEL],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr == "wedlm-hf generate: error: the prompt is empty: decoding needs at least one prompt token\n"
