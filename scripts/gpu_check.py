"""The GPU check of WeDLM decoding, one table: forward costs, step costs, host syncs, the compiled path, GPU tests.

On a randomly initialised Qwen3-8B-shaped model in bf16, built on the GPU (no download; `gpu_window_cost.py`):

1. window forward: a W=16 window forward vs a 1-token forward after a cached 1k / 4k context, sdpa and
   flash_attention_2 when `flash_attn` imports (`gpu_window_cost.window_costs`).
   forward cost: the cost model's table (`wedlm_hf/generation/forward_cost.py`) measured here, a forward of 2 to
   17 tokens per row as a multiple of a one-token forward at batch 1, 8 and 32, and the scale it implies against
   the one declared for accelerators; try cost: what a failed try of lossless mode's adaptive schedule costs in AR
   forwards, 2 x (W=3 / AR - 1), against the cost model's price of it.
2. decode, eager: whole greedy decodes of `--new-tokens` after a `--context`-token prompt. AR is transformers'
   `generate`; WeDLM runs with a *scripted acceptance*: a forward hook keeps the model's real forward (its cost)
   but replaces the logits so that exactly the first k mask slots of each window are confident (one-hot on a token
   fixed by the slot's position) and every other slot is uniform (maximal entropy, never filled). Each step then
   commits k tokens, which is what a trained model accepting k tokens per step costs; k comes from `--accepted`.
   Host syncs per forward are counted in a separate, untimed decode (`torch.cuda.set_sync_debug_mode`).
3. decode, compiled: the same with transformers' static cache + `torch.compile` for AR and WeDLM's static-shape
   path (`cache_implementation="static"`, generation/pool.py) for WeDLM, one `CompileConfig`, after a warm-up.
4. `tests/gpu`, in a subprocess: FlashAttention-2 vs SDPA token equality (`test_flash.py`), and the static path on
   CUDA, eager and compiled with CUDA graphs (`test_static_cuda.py`).

Rows print as they are measured; the JSON (`--json`, default `$OUT/gpu_check.json` when `OUT` is set) is
rewritten after every row. `--smoke` runs a tiny fp32 model on the CPU in under a minute, to test the script.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import CompileConfig

import gpu_window_cost
import wedlm_hf
from wedlm_hf.generation.forward_cost import ForwardCost

HEADER = (
    "| check | arm | setting | ms per forward | tokens per forward | tokens/s | vs ar | host syncs per forward |\n"
    "|---|---|---|---|---|---|---|---|"
)
LEGEND = (
    "vs ar: for a window forward, its cost over a 1-token forward (lower is better); for the try cost, a failed "
    "try's cost in AR forwards; for a decode, tokens/s over "
    "the AR decode of the same section (higher is better). ms per forward: a whole decode's time (prefill "
    "included) over its forwards."
)


class ScriptedAcceptance:
    """Forward hook: while scripted, the first k mask slots of every window are confident, all other slots uniform.

    The model's forward runs unchanged (its cost is what is measured); only its logits are replaced. A confident
    slot's token is fixed by its position and avoids ids below 3 (pad, BOS, EOS) and the mask (the last id).
    It stays attached for the whole run and k is a tensor changed in place: attaching hooks or changing a Python
    attribute between decodes would make torch.compile recompile the step."""

    def __init__(self, model):
        self.vocab_size = model.config.vocab_size
        self.mask_id = self.vocab_size - 1
        self.accepted = torch.zeros((), dtype=torch.long, device=model.device)
        self.active = False
        model.register_forward_hook(self, with_kwargs=True)

    @contextmanager
    def script(self, accepted: int | None):
        """Decode with k = `accepted` tokens committed per step; None: the model's own logits (AR arms)."""
        self.active = accepted is not None
        self.accepted.fill_(accepted or 0)
        try:
            yield
        finally:
            self.active = False

    def __call__(self, module, args, kwargs, output) -> None:
        if not self.active:
            return
        logits = output.logits
        keep = logits.shape[1]
        ids, positions = kwargs["input_ids"][:, -keep:], kwargs["position_ids"][:, -keep:]
        is_mask = ids == self.mask_id
        confident = is_mask & (is_mask.long().cumsum(1) <= self.accepted)  # masks are fed last, in slot order
        tokens = 3 + positions % (self.vocab_size - 4)
        peak = torch.where(confident, 50.0, 0.0).to(logits.dtype)
        logits.zero_().scatter_(2, tokens[..., None], peak[..., None])


class SyncCounter:
    """Host syncs during a block: CUDA's sync debug mode on a GPU; on the CPU, Python reads of tensor values
    (`item`, `bool`, `int`, `float`, `tolist`), a lower bound of a GPU's syncs (`nonzero` is not counted)."""

    METHODS = ("item", "__bool__", "__int__", "__float__", "tolist")

    def __init__(self, device: torch.device):
        self.device, self.count = device, 0

    def __enter__(self) -> "SyncCounter":
        if self.device.type == "cuda":
            self._warnings = warnings.catch_warnings(record=True)
            self._records = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._originals = {name: getattr(torch.Tensor, name) for name in self.METHODS}
            for name, method in self._originals.items():
                setattr(torch.Tensor, name, self._counting(method))
        return self

    def _counting(self, method):
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return method(tensor, *args, **kwargs)

        return counted

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
            self.count = sum("synchroniz" in str(r.message) for r in self._records)
            self._warnings.__exit__(*exc)
        else:
            for name, method in self._originals.items():
                setattr(torch.Tensor, name, method)


def decode(model, prompt: torch.Tensor, new_tokens: int, options: dict, timed: bool = True) -> tuple[float, int, int]:
    """Seconds, forwards and generated tokens of one greedy decode (EOS off, so exactly `new_tokens`).

    Forwards come from WeDLM's stats, and are one per token for AR (no counting hook: it would recompile)."""
    synchronize = torch.cuda.synchronize if timed and model.device.type == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    output = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens, do_sample=False,
        eos_token_id=None, return_dict_in_generate=True, **options,
    )
    synchronize()
    generated = output.sequences.shape[1] - prompt.shape[1]
    stats = getattr(output, "wedlm_stats", None)
    return time.perf_counter() - start, stats.model_calls if stats is not None else generated, generated


class Report:
    """The one table: rows print as they come; the JSON is rewritten after each."""

    def __init__(self, title: str, json_path: Path | None):
        self.rows, self.json_path, self.title, self.failures = [], json_path, title, 0
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
        print(title)
        print(HEADER, flush=True)

    def add(self, check, arm, setting, ms=None, per_forward=None, tokens_s=None, ratio=None, syncs=None, **extra):
        row = dict(check=check, arm=arm, setting=setting, ms_per_forward=ms, tokens_per_forward=per_forward,
                   tokens_per_s=tokens_s, vs_ar=ratio, syncs_per_forward=syncs, **extra)
        self.rows.append(row)
        cells = [check, arm, setting] + [
            "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
            for v in (ms, per_forward, tokens_s, ratio, syncs)
        ]
        print("| " + " | ".join(cells) + " |", flush=True)
        if self.json_path is not None:
            self.json_path.write_text(json.dumps({"model": self.title, "rows": self.rows}, indent=2) + "\n")

    def guarded(self, check: str, section) -> None:
        """Run one section; a failure becomes a FAILED row and the run goes on, so one broken part (a kernel, a
        compiler) cannot hide the others' results."""
        try:
            section()
        except Exception as error:  # reported in the table and on stderr, and counted for the exit status
            self.failures += 1
            traceback.print_exc()
            self.add(check, "FAILED", f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}")


def decode_section(
    report: Report, model, hook: ScriptedAcceptance, check: str, arms: dict, prompt, new_tokens: int, repeats: int
) -> None:
    """Warm-up, then `repeats` interleaved timed decodes per arm (medians), then one untimed sync-counting decode.

    `arms` maps a name to (generate keywords, accepted tokens per step or None for AR); the first is AR."""

    def run(name, timed=True):
        options, accepted = arms[name]
        with hook.script(accepted):
            return decode(model, prompt, new_tokens, options, timed)

    for name in arms:
        run(name)
    timings = {name: [] for name in arms}
    for repeat in range(repeats):
        for name in list(arms)[repeat % len(arms) :] + list(arms)[: repeat % len(arms)]:
            timings[name].append(run(name))
    ar_speed = None
    for name, samples in timings.items():
        seconds = statistics.median(s for s, _, _ in samples)
        _, forwards, generated = samples[0]
        with SyncCounter(model.device) as syncs:
            run(name, timed=False)
        speed = generated / seconds
        ar_speed = ar_speed or speed
        report.add(check, name, f"context {prompt.shape[1]}, {new_tokens} new", 1000 * seconds / forwards,
                   generated / forwards, speed, speed / ar_speed, round(syncs.count / forwards, 1))


def gpu_tests(report: Report) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu"],
        capture_output=True, text=True,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else result.stderr.strip()[-200:]
    report.add("GPU tests", "tests/gpu", summary.strip("= "), returncode=result.returncode)
    report.failures += result.returncode != 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny fp32 model on the CPU (< 1 min): tests the script")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 36, the 8B shape)")
    parser.add_argument("--contexts", default=None, help="window-forward contexts (default 1024,4096)")
    parser.add_argument("--context", type=int, default=None, help="prompt length of the decodes (default 1024)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per decode (default 128)")
    parser.add_argument("--accepted", default="1,4,8", help="scripted tokens committed per WeDLM step")
    parser.add_argument("--repeats", type=int, default=None, help="timed decodes per arm (default 3)")
    parser.add_argument("--compile-backend", default=None, help="default: inductor (eager in --smoke)")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--json", default=None, metavar="PATH", help="default: $OUT/gpu_check.json when OUT is set")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check: needs a CUDA GPU (or --smoke for a CPU check of the script)")
    smoke = args.smoke
    contexts = [int(c) for c in (args.contexts or ("64,256" if smoke else "1024,4096")).split(",")]
    context = args.context or (64 if smoke else 1024)
    new_tokens = args.new_tokens or (32 if smoke else 128)
    repeats = args.repeats or (1 if smoke else 3)
    backend = args.compile_backend or ("eager" if smoke else "inductor")
    accepted = [int(k) for k in args.accepted.split(",")]
    json_path = Path(args.json) if args.json else (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)

    if smoke:
        torch.set_num_threads(1)
    model = wedlm_hf.enable(gpu_window_cost.build_model(smoke, args.layers or (2 if smoke else None)))
    model.generation_config.pad_token_id = 0
    report = Report(gpu_window_cost.describe(model), json_path)

    def window_forwards():
        for r in gpu_window_cost.window_costs(model, contexts, 16, 1 if smoke else 5, 2 if smoke else 30):
            setting = f"context {r['context']}"
            report.add("window forward", f"{r['attention']} ar 1-token", setting, r["ar_ms"])
            report.add("window forward", f"{r['attention']} W=16 window", setting, r["window_ms"], ratio=r["ratio"])

    declared = ForwardCost.declared(model.device.type)

    def forward_cost_table():
        """The cost model's table here, against the declared scale (`forward_cost.py`)."""
        widths, (warmup, repeats) = (2, 4, 8, 17), ((1, 2) if smoke else (3, 10))
        for row in gpu_window_cost.cost_table(model, contexts[0], (1, 8, 32), widths, warmup, repeats):
            setting = f"context {contexts[0]}, batch {row['rows']}"
            for width, relative in zip(widths, row["relative"]):
                report.add("forward cost", f"{width} tokens per row", setting, ratio=relative,
                           declared=declared.relative(row["rows"], width))
            report.add("forward cost", f"implied scale (declared {declared.scale:g})", setting,
                       ratio=row["implied_scale"])

    def try_cost():
        """What a failed try of lossless mode's adaptive schedule costs here, in AR forwards, against what the cost
        model declared for this device prices the same forwards at."""
        cost = gpu_window_cost.try_cost(model, contexts[0], 1 if smoke else 5, 2 if smoke else 30)
        setting = f"context {contexts[0]}, cost model {2 * (declared.relative(1, 3) - 1):.3f}"
        report.add("try cost", "sdpa 2 x (W=3 / AR - 1)", setting, ratio=cost)

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size - 1, (1, context), generator=generator).to(model.device)
    wedlm = {"decoding": "wedlm", "mask_token_id": model.config.vocab_size - 1}
    hook = ScriptedAcceptance(model)

    def eager_decodes():
        arms = {"ar": ({"decoding": "ar"}, None)} | {f"wedlm k={k}": (wedlm, k) for k in accepted}
        decode_section(report, model, hook, "decode, eager sdpa", arms, prompt, new_tokens, repeats)

    def compiled_decodes():
        compile_config = CompileConfig(backend=backend, mode="reduce-overhead" if backend == "inductor" else None)
        compile_config._compile_all_devices = True  # transformers compiles AR decoding only on accelerators
        static = {"cache_implementation": "static", "compile_config": compile_config,
                  "max_cache_len": context + new_tokens + 64}
        arms = {"ar static+compile": ({"decoding": "ar"} | static, None)} | {
            f"wedlm static+compile k={k}": (wedlm | static, k) for k in (1, max(accepted))
        }
        graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        decode_section(report, model, hook, f"decode, compiled ({backend})", arms, prompt, new_tokens, repeats)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
        setting = f"{graphs} graphs for {len(arms) * (repeats + 2)} decodes (2 expected: one AR step, one WeDLM step)"
        report.add("recompiles", "dynamo", setting, graphs=graphs)

    with torch.inference_mode():
        report.guarded("window forward", window_forwards)
        report.guarded("forward cost", forward_cost_table)
        report.guarded("try cost", try_cost)
        report.guarded("decode, eager sdpa", eager_decodes)
        if not args.skip_compile:
            report.guarded("decode, compiled", compiled_decodes)
    gpu_tests(report)
    print(LEGEND)
    if report.failures:
        raise SystemExit(f"gpu_check: {report.failures} section(s) failed; see the FAILED rows")

if __name__ == "__main__":
    main()
