"""Load test of `wedlm-hf serve`: WeDLM with continuous batching, WeDLM without it (one request at a time) and
transformers' own `--continuous_batching` (AR, paged attention) on the same model, side by side in one run.

Each arm's server is started on 127.0.0.1 in a subprocess, driven by 1, 4, 8 and 16 concurrent clients with
mixed prompts (counting and code) and output lengths, streamed and not, then stopped. With `--sampling mixed`
every other pair of requests samples (temperature 0.8, top_p 0.95, a seed of its own) and the others are greedy.
Reported per arm and concurrency: completion tokens per second over the wall time, p50/p95 latency, p50/p95 time
to first token (streamed requests; a non-streamed request's first token is its whole answer), failures, and how
many requests got the same text as when sent alone (the first arm's run at 1 client, the one-at-a-time server's
where it ran): greedy requests must, and seeded ones too, since a seeded request's draws are its own.

With `--one-by-one` it measures what continuous batching is for, on the continuous-batching server alone: N
clients sending max(N, `--requests`) requests (8 by default here) against the same requests sent one by one, for
greedy, sampled (seeded) and lossless requests (a second server, `--lossless`), at 1, 8 and 16 clients, the two
side by side in every repeat (which goes first alternating) and every level and kind interleaved; per kind and
level, the medians of the repeats' ratios and throughputs, and how many texts were the same both ways. At 1
client both ways send the requests one by one: the ratio is the measurement's noise.

    python scripts/load_test_serve.py                          # the full run (minutes)
    python scripts/load_test_serve.py --clients 1 2 --requests 4   # a smoke run
    python scripts/load_test_serve.py --one-by-one --threads 1     # concurrent vs one by one (minutes)
"""

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import wedlm_hf

ARMS = {
    "wedlm-cb": "WeDLM, --continuous-batching",
    "wedlm": "WeDLM, one request at a time",
    "ar-cb": "transformers --continuous_batching (AR)",
}
COUNTING = ["1, 2, 3, 4,", "10, 11, 12, 13,", "100, 101, 102,", "5, 10, 15, 20,"]
CODE = ["def add(a, b):", "for i in range(10):", "class Point:", "import os\n"]
OUTPUT_LENGTHS = [32, 96, 64, 16]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(
    arm: str, model: str, port: int, max_batch_size: int, args: argparse.Namespace, lossless: bool
) -> list[str]:
    if arm == "ar-cb":
        return [sys.executable, __file__, "--serve-ar-cb", str(port), "--model", model]
    command = ["serve", model, "--host", "127.0.0.1", "--port", str(port)] + (["--lossless"] if lossless else [])
    command += ["--threads", str(args.threads)] if args.threads else []
    if arm == "wedlm-cb":
        command += ["--continuous-batching", "--max-batch-size", str(max_batch_size)]
    return [sys.executable, "-c", "import sys, wedlm_hf_cli; sys.exit(wedlm_hf_cli.main(sys.argv[1:]))", *command]


def serve_ar_continuous_batching(model: str, port: int) -> None:
    """transformers serve with its own continuous batching; the WeDLM classes made loadable, nothing else."""
    from transformers.cli.serve import Serve

    from wedlm_hf import serving

    with serving.ServeHooks({}):  # WeDLM architectures by name; transformers' CB manager decodes AR regardless
        Serve(force_model=model, host="127.0.0.1", port=port, continuous_batching=True, log_level="error")


def wait_healthy(base_url: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no healthy server at {base_url} within {timeout} s")


PROMPT_SETS = {"mixed": (COUNTING, CODE), "counting": (COUNTING,), "code": (CODE,)}


SAMPLED = {"temperature": 0.8, "top_p": 0.95}
KINDS = {"greedy": ({}, False), "sampled": (SAMPLED, False), "lossless": ({}, True)}
"""`--one-by-one`'s kinds of request: the sampling each sends (with a seed of its own) and whether its server is
lossless."""


def workload(requests: int, prompt_set: str = "mixed", sampling: str = "greedy") -> list[dict]:
    """Prompts of `prompt_set` (mixed: counting and code alternating), mixed output lengths, every other pair of
    requests streamed; with `sampling` "mixed", requests 2-3 of every 4 sample, each with its own seed."""
    jobs, sets = [], PROMPT_SETS[prompt_set]
    for i in range(requests):
        prompts = sets[i % len(sets)]
        prompt = prompts[(i // len(sets)) % len(prompts)]
        job = {"prompt": prompt, "max_tokens": OUTPUT_LENGTHS[i % 4], "stream": i % 4 < 2}
        if sampling == "mixed" and i % 4 in (1, 2):
            job.update(SAMPLED, seed=1000 + i)
        jobs.append(job)
    return jobs


def send(client: httpx.Client, base_url: str, model: str, job: dict) -> dict:
    """One completion request: latency, time to first token, completion tokens (or the error)."""
    body = {"model": model, **job}
    start = time.perf_counter()
    try:
        if not job["stream"]:
            response = client.post(f"{base_url}/v1/completions", json=body)
            response.raise_for_status()
            latency = time.perf_counter() - start
            answer = response.json()
            tokens, text = answer["usage"]["completion_tokens"], answer["choices"][0]["text"]
            return {"latency": latency, "ttft": latency, "tokens": tokens, "text": text}
        first, tokens, text = None, 0, ""
        with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                pieces = "".join(choice.get("text") or "" for choice in chunk.get("choices", []))
                if first is None and pieces:
                    first = time.perf_counter() - start
                text += pieces
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        latency = time.perf_counter() - start
        return {"latency": latency, "ttft": first if first is not None else latency, "tokens": tokens, "text": text}
    except Exception as error:  # a failed request is counted, not fatal
        return {"error": f"{type(error).__name__}: {error}"}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else float("nan")


def uniform_workload(requests: int, kind: str, max_tokens: int) -> list[dict]:
    """`requests` non-streamed completions of `max_tokens` tokens each, counting and code prompts alternating,
    sampling as `kind` says (each sampled one with its own seed)."""
    sampling, _ = KINDS[kind]
    jobs = []
    for i in range(requests):
        prompts = (COUNTING, CODE)[i % 2]
        job = {"prompt": prompts[(i // 2) % len(prompts)], "max_tokens": max_tokens, "stream": False, **sampling}
        jobs.append({**job, "seed": 1000 + i} if sampling else job)
    return jobs


def drive(
    base_url: str, model: str, clients: int, requests: int, timeout: float, prompt_set: str = "mixed",
    sampling: str = "greedy",
) -> dict:
    return drive_jobs(base_url, model, clients, workload(requests, prompt_set, sampling), timeout)


def drive_jobs(base_url: str, model: str, clients: int, jobs: list[dict], timeout: float) -> dict:
    with httpx.Client(timeout=timeout) as client, ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda job: send(client, base_url, model, job), jobs))
        wall = time.perf_counter() - start
    done = [r for r in results if "error" not in r]
    streamed = [r["ttft"] for r, job in zip(results, jobs) if job["stream"] and "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    return {
        "tokens_per_s": sum(r["tokens"] for r in done) / wall,
        "p50_latency": percentile([r["latency"] for r in done], 0.5),
        "p95_latency": percentile([r["latency"] for r in done], 0.95),
        "p50_ttft": percentile(streamed, 0.5),
        "p95_ttft": percentile(streamed, 0.95),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "wall_s": wall,
        "texts": [r.get("text") for r in results],
    }


def start_arm(arm: str, args: argparse.Namespace, lossless: bool) -> tuple[subprocess.Popen, str]:
    """The arm's server, healthy and warmed up (first-request loading and allocation), or a RuntimeError."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = server_command(arm, args.model, port, max(args.clients), args, lossless)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(base_url, process, args.start_timeout)
        drive(base_url, args.model, 1, 2, args.timeout)
    except (RuntimeError, TimeoutError) as error:
        stop(process)
        raise RuntimeError(f"{arm}: {error}\n{process.stderr.read()[-2000:]}") from None
    return process, base_url


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()


def run_arms(args: argparse.Namespace) -> dict[str, dict[int, dict]]:
    """Every arm's server up at once (idle ones cost no CPU); each repeat drives every concurrency level on every
    arm in turn, so load from outside hits the arms alike; per arm and level, the medians over the repeats."""
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for arm in args.arms:
            servers[arm] = start_arm(arm, args, args.lossless)
        runs = {arm: {clients: [] for clients in args.clients} for arm in args.arms}
        for _ in range(args.repeats):
            for clients in args.clients:
                for arm, (_, base_url) in servers.items():
                    runs[arm][clients].append(
                        drive(base_url, args.model, clients, args.requests, args.timeout, args.prompts, args.sampling)
                    )
        return {arm: {clients: medians(levels[clients]) for clients in levels} for arm, levels in runs.items()}
    finally:
        for process, _ in servers.values():
            stop(process)


def run_one_by_one(args: argparse.Namespace) -> dict[tuple[str, int], dict]:
    """Per kind and level N: N clients sending max(N, `args.requests`) requests and the same ones one by one on the
    same continuous-batching server, side by side in each repeat; the medians over the repeats
    (`one_by_one_summary`)."""
    servers: dict[bool, tuple[subprocess.Popen, str]] = {}
    try:
        for lossless in sorted({KINDS[kind][1] for kind in args.kinds}):
            servers[lossless] = start_arm("wedlm-cb", args, lossless)
        runs = {(kind, clients): [] for clients in args.clients for kind in args.kinds}
        for repeat in range(args.repeats):
            for clients in args.clients:
                for kind in args.kinds:
                    jobs = uniform_workload(max(clients, args.requests), kind, args.max_tokens)
                    base_url = servers[KINDS[kind][1]][1]
                    at_once_first = repeat % 2 == 0
                    counts = (clients, 1) if at_once_first else (1, clients)
                    measured = [drive_jobs(base_url, args.model, count, jobs, args.timeout) for count in counts]
                    runs[(kind, clients)].append(tuple(measured if at_once_first else measured[::-1]))
        return {key: one_by_one_summary(pairs) for key, pairs in runs.items()}
    finally:
        for process, _ in servers.values():
            stop(process)


def one_by_one_summary(pairs: list[tuple[dict, dict]]) -> dict:
    """(at once, one by one) per repeat: median throughputs, the median of the repeats' ratios, p50 latencies,
    errors, and the fewest requests of a repeat whose text was the same both ways."""
    same = [sum(a == b is not None for a, b in zip(at_once["texts"], alone["texts"])) for at_once, alone in pairs]
    ratios = [at_once["tokens_per_s"] / alone["tokens_per_s"] for at_once, alone in pairs]
    return {
        "at_once": statistics.median(a["tokens_per_s"] for a, _ in pairs),
        "one_by_one": statistics.median(b["tokens_per_s"] for _, b in pairs),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "p50_at_once": statistics.median(a["p50_latency"] for a, _ in pairs),
        "p50_one_by_one": statistics.median(b["p50_latency"] for _, b in pairs),
        "errors": sum(a["errors"] + b["errors"] for a, b in pairs),
        "same_text": f"{min(same)}/{len(pairs[0][0]['texts'])}",
        "first_error": next((r["first_error"] for pair in pairs for r in pair if r["first_error"]), ""),
    }


def one_by_one_table(results: dict[tuple[str, int], dict]) -> str:
    header = (
        "| kind | clients | one by one tokens/s | at once tokens/s | at once vs one by one (each repeat) | "
        "p50 latency s, one by one / at once | errors | same text both ways (fewest in a repeat) |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    rows = []
    for kind, clients in sorted(results, key=lambda key: (list(KINDS).index(key[0]), key[1])):
        r = results[(kind, clients)]
        rows.append(
            f"| {kind} | {clients} | {r['one_by_one']:.1f} | {r['at_once']:.1f} | **{r['ratio']:.2f}x** "
            f"({', '.join(f'{x:.2f}' for x in r['ratios'])}) | {r['p50_one_by_one']:.3f} / {r['p50_at_once']:.3f} | "
            f"{r['errors']} | {r['same_text']} |"
        )
    return "\n".join([header, *rows])


def machine() -> str:
    """The CPU as `lscpu` names it (its model name line), else what Python knows."""
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: how busy other work kept the machine around the figures."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def medians(repeats: list[dict]) -> dict:
    """One level's repeats: the median of each figure, the errors summed, the texts of the first repeat (and None
    for a request whose text changed between repeats)."""
    summary = {name: statistics.median(r[name] for r in repeats) for name in FIGURES}
    texts = [texts[0] if len(set(texts)) == 1 else None for texts in zip(*(r["texts"] for r in repeats))]
    errors = [r["first_error"] for r in repeats if r["first_error"]]
    return {**summary, "errors": sum(r["errors"] for r in repeats), "first_error": errors[0] if errors else "",
            "texts": texts}


FIGURES = ("tokens_per_s", "p50_latency", "p95_latency", "p50_ttft", "p95_ttft", "wall_s")


def table(results: dict[str, dict[int, dict]], clients: list[int]) -> str:
    header = (
        "| clients | arm | tokens/s | vs sequential | p50 latency s | p95 latency s | p50 TTFT s | p95 TTFT s | "
        "errors | same text as alone |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    rows, alone = [], alone_texts(results, clients)
    for count in clients:
        baseline = results.get("wedlm", {}).get(count, {}).get("tokens_per_s")
        for arm, by_clients in results.items():
            r = by_clients.get(count)
            if r is None:
                continue
            ratio = f"{r['tokens_per_s'] / baseline:.2f}x" if baseline else "-"
            rows.append(
                f"| {count} | {ARMS[arm]} | {r['tokens_per_s']:.1f} | {ratio} | {r['p50_latency']:.3f} | "
                f"{r['p95_latency']:.3f} | {r['p50_ttft']:.3f} | {r['p95_ttft']:.3f} | {r['errors']} | "
                f"{sum(a == b is not None for a, b in zip(r['texts'], alone))}/{len(alone)} |"
            )
    return "\n".join([header, *rows])


def alone_texts(results: dict[str, dict[int, dict]], clients: list[int]) -> list[str | None]:
    """Each request's text when sent alone: the one-at-a-time server's at the fewest clients, else the first arm's."""
    arm = "wedlm" if results.get("wedlm") else next((arm for arm, runs in results.items() if runs), None)
    return results[arm][min(clients)]["texts"] if arm else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=wedlm_hf.DEFAULT_MODEL)
    parser.add_argument(
        "--clients", type=int, nargs="+", help="concurrency levels (default 1 4 8 16; with --one-by-one 1 8 16)"
    )
    parser.add_argument(
        "--requests", type=int, help="requests per concurrency level (default 32; with --one-by-one at least, 8)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds over every level and arm (medians reported)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--timeout", type=float, default=120, help="seconds per request")
    parser.add_argument("--start-timeout", type=float, default=180, help="seconds for a server to come up")
    parser.add_argument(
        "--prompts", default="mixed", choices=list(PROMPT_SETS), help="mixed: counting and code alternating"
    )
    parser.add_argument(
        "--sampling", default="greedy", choices=["greedy", "mixed"],
        help="mixed: half the requests sample (temperature 0.8, top_p 0.95, a seed each), half are greedy",
    )
    parser.add_argument("--lossless", action="store_true", help="serve the WeDLM arms with --lossless")
    parser.add_argument("--threads", type=int, help="torch threads of the WeDLM servers (default: serve's)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--one-by-one", action="store_true",
        help="the continuous-batching server alone: N clients' requests vs the same requests one by one, per kind",
    )
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS), help="with --one-by-one")
    parser.add_argument("--max-tokens", type=int, default=160, help="each request's max_tokens, with --one-by-one")
    parser.add_argument("--serve-ar-cb", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_ar_cb:
        serve_ar_continuous_batching(args.model, args.serve_ar_cb)
        return 0
    if args.one_by_one:
        return main_one_by_one(args)
    args.clients, args.requests = args.clients or [1, 4, 8, 16], args.requests or 32
    results = measured(run_arms, args)
    if results is None:
        return 1
    print(
        f"model: {args.model}; {args.requests} requests per level, medians of {args.repeats} interleaved repeats; "
        f"prompts: {args.prompts}; sampling: {args.sampling}; WeDLM {'lossless' if args.lossless else 'plain'}; "
        f"threads: {args.threads or 'serve default'}"
    )
    print(table(results, args.clients))
    for arm, by_clients in results.items():
        for count, r in by_clients.items():
            if r["first_error"]:
                print(f"{arm} at {count} clients, first error: {r['first_error']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def measured(run, args: argparse.Namespace) -> dict | None:
    """`run(args)`'s results, or None after printing why on one line (a server that did not start)."""
    try:
        return run(args)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return None


def main_one_by_one(args: argparse.Namespace) -> int:
    args.clients, args.requests = args.clients or [1, 8, 16], args.requests or 8
    started = load_average()
    results = measured(run_one_by_one, args)
    if results is None:
        return 1
    print(
        f"model: {args.model}; continuous-batching server, at least {args.requests} requests per level of "
        f"{args.max_tokens} tokens each (counting and code prompts alternating), medians of {args.repeats} "
        f"interleaved repeats; threads: {args.threads or 'serve default'}; {machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs, load average {started} at the start, {load_average()} at the end"
    )
    print(one_by_one_table(results))
    for (kind, clients), r in results.items():
        if r["first_error"]:
            print(f"{kind} at {clients} clients, first error: {r['first_error']}")
    if args.json:
        args.json.write_text(json.dumps({f"{kind}@{clients}": r for (kind, clients), r in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
