"""Generate a continuation with WeDLM decoding (default: the embedded checkpoint) and print its statistics."""

import argparse
import re
import sys
import time
from pathlib import Path

import torch

import wedlm_hf
from wedlm_hf.batch.padded import ar_finish_reason, eos_token_ids
from wedlm_hf.commands.generate_batch import add_batch_arguments, run_batch, uses_batch_mode
from wedlm_hf.commands.options import add_wedlm_arguments, given_flags, wedlm_keywords
from wedlm_hf.commands.placement import add_threads_argument, resolve_device
from wedlm_hf.generation.validation import position_limit_error
from wedlm_hf.loading.names import MODEL_HELP

ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "prompt", nargs="?",
        help=r"text to continue ('\n' and '\t' are read as escapes); '-' reads standard input (less the one "
        "newline that ends it, as `echo` adds)",
    )
    parser.add_argument("--prompt-file", type=Path, help="read the prompt from this file instead (as is)")
    parser.add_argument(
        "--model", help=MODEL_HELP + " (default: the embedded checkpoint)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message with the chat template")
    parser.add_argument("--stream", action="store_true", help="print tokens as they are committed")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ar", action="store_true", help="transformers' usual autoregressive decoding instead of WeDLM")
    add_wedlm_arguments(parser.add_argument_group("WeDLM parameters"), mode)
    sampling = parser.add_argument_group("sampling (default: greedy)")
    sampling.add_argument("--do-sample", action="store_true", help="sample each token instead of taking the argmax")
    sampling.add_argument("--temperature", type=float, help="with --do-sample (default: the model's generation config)")
    sampling.add_argument("--top-p", type=float, help="with --do-sample (default: the model's generation config)")
    sampling.add_argument("--seed", type=int, help="seed torch's generator, for a reproducible sample")
    placement = parser.add_argument_group("placement")
    placement.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="'auto': the checkpoint's"
    )
    placement.add_argument("--device", default="auto", help="'auto': cuda if available, else cpu; or e.g. cpu, cuda:1")
    add_threads_argument(placement)
    add_batch_arguments(parser)
    parser.epilog = STATS_EPILOG
    parser.set_defaults(run=run)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from the command line (with escapes), standard input (`-`) or `--prompt-file`; never empty."""
    if args.prompt_file is not None:
        if args.prompt is not None:
            raise ValueError("give the prompt either as an argument or with --prompt-file, not both")
        try:
            prompt = args.prompt_file.read_text()
        except FileNotFoundError:
            raise ValueError(f"--prompt-file {args.prompt_file}: no such file") from None
        except OSError as error:
            raise ValueError(f"--prompt-file {args.prompt_file}: {error.strerror or error}") from None
    elif args.prompt == "-":
        prompt = sys.stdin.read().removesuffix("\n")  # `echo PROMPT |` ends it with a newline the user did not type
    elif args.prompt is None:
        raise ValueError("no prompt: give it as an argument, '-' to read standard input, or --prompt-file FILE")
    else:
        prompt = re.sub(r"\\([nt\\])", lambda match: ESCAPES[match.group(1)], args.prompt)
    if not prompt:
        raise ValueError("the prompt is empty: decoding needs at least one prompt token")
    return prompt


def generation_options(args: argparse.Namespace) -> dict:
    """`generate` keywords for the chosen mode; an option the mode would ignore is an error, not a no-op."""
    options = {"max_new_tokens": args.max_new_tokens, "do_sample": args.do_sample}
    wedlm = wedlm_keywords(args)  # an option not given is left to the model's generation config
    if args.ar:
        if wedlm:
            given = ", ".join(given_flags(args))
            raise ValueError(f"{given} set WeDLM decoding, which --ar turns off: drop one or the other")
        options["decoding"] = "ar"
    else:
        options.update(decoding="wedlm", **wedlm)
    for name in ("temperature", "top_p"):
        if getattr(args, name) is not None:
            if not args.do_sample:
                raise ValueError(f"--{name.replace('_', '-')} applies only to sampling: add --do-sample")
            options[name] = getattr(args, name)
    return options


def load(args: argparse.Namespace):
    """The tokenizer and the WeDLM-enabled model, in eval mode on the chosen device and dtype."""
    from transformers.utils import logging

    from wedlm_hf.loading import load_model_and_tokenizer

    logging.disable_progress_bar()  # keep stdout to the continuation and the stats line
    model, tokenizer = load_model_and_tokenizer(args.model, dtype=args.dtype)
    return tokenizer, wedlm_hf.enable(model.to(resolve_device(args.device)).eval())


def encode(tokenizer, model, prompt: str, chat: bool, max_new_tokens: int) -> dict:
    """Tokenised prompt on the model's device, checked: at least one token, and room for `max_new_tokens`."""
    if chat:
        if tokenizer.chat_template is None:
            raise ValueError("--chat: this tokenizer has no chat template; drop --chat")
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    length = inputs["input_ids"].shape[1]
    if length == 0:
        raise ValueError("the prompt encodes to no tokens: decoding needs at least one prompt token")
    problem = position_limit_error(model, length, max_new_tokens, budget_name="--max-new-tokens")
    if problem is not None:
        raise ValueError(problem)
    return {name: tensor.to(model.device) for name, tensor in inputs.items()}


STOPPED = {
    "eos": "stopped at the model's end-of-text token (eos)",
    "length": "stopped at --max-new-tokens (length)",
    "stop": "stopped at a stop string (stop)",
}
"""Why decoding ended, in words, with `finish_reason` (what batch mode's JSON rows and the servers say) after."""

STATS_EPILOG = (
    "After the continuation comes one line of statistics: the tokens generated, the forwards (calls of the model) "
    "they took and tokens per forward, how many tokens each call produced (ordinary decoding, --ar, makes 1); in "
    "lossless mode the guessed tokens accepted; p_cache, the share of the tokens fed to the model that became "
    "output; tokens per second; and why decoding stopped. The same figures as JSON, a line per prompt: batch mode "
    "(--input/--output)."
)


def count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def stats_line(output, generated: int, seconds: float, finish_reason: str) -> str:
    """The run in one line of plain words (`STATS_EPILOG`), ending in why it stopped (an empty continuation is most
    often an `eos` at once)."""
    stats = getattr(output, "wedlm_stats", None)
    speed, stopped = f"{generated / seconds:.1f} tokens/s", STOPPED[finish_reason]
    if stats is None:
        tokens, forwards = count(generated, "token"), count(generated, "forward")
        return f"[ar] {tokens} in {forwards} (ordinary decoding); {speed}; {stopped}"
    summary = stats.summary()
    parts = [
        f"{count(summary['generated'], 'token')} in {count(summary['forwards'], 'forward')}: "
        f"{summary['tokens_per_forward_row_mean']:.2f} tokens per forward (ordinary decoding: 1)"
    ]
    if "drafted" in summary:  # lossless mode checks guesses: the line says which mode ran, whichever flag chose it
        parts.append(f"{summary['accepted']} of {count(summary['drafted'], 'guessed token')} accepted")
    parts += [f"{summary['p_cache']:.0%} of the tokens fed to the model became output (p_cache)", speed, stopped]
    return "[wedlm] " + "; ".join(parts)


def finish_reason(output, model, tokenizer, new_tokens: list[int], max_new_tokens: int) -> str:
    """'eos', 'stop' or 'length': WeDLM records it; an autoregressive run is read off its tokens, as batch mode
    reads it."""
    stats = getattr(output, "wedlm_stats", None)
    if stats is not None:
        return stats.finish_reasons[0]
    return ar_finish_reason(new_tokens, eos_token_ids(tokenizer, model.generation_config), max_new_tokens)


def run(args: argparse.Namespace) -> int:
    if uses_batch_mode(args):
        return run_batch(args, generation_options(args), None if args.device == "auto" else resolve_device(args.device))
    from transformers import TextStreamer, set_seed

    prompt = read_prompt(args)
    options = generation_options(args)
    tokenizer, model = load(args)
    inputs = encode(tokenizer, model, prompt, args.chat, args.max_new_tokens)
    if args.seed is not None:
        set_seed(args.seed)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if args.stream else None
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(**inputs, **options, streamer=streamer, return_dict_in_generate=True)
    seconds = time.perf_counter() - start
    new_tokens = output.sequences[0, inputs["input_ids"].shape[1] :]
    if streamer is None:
        print(tokenizer.decode(new_tokens, skip_special_tokens=True))
    reason = finish_reason(output, model, tokenizer, new_tokens.tolist(), args.max_new_tokens)
    print(stats_line(output, len(new_tokens), seconds, reason))
    return 0
