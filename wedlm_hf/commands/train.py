"""`wedlm-hf train`: train the embedded WeDLM checkpoint from scratch on CPU (`wedlm_hf/training/recipe.py`)."""

import argparse

from ..evaluation.default_decoding import DefaultDecoding
from ..training.recipe import TrainOptions
from .options import add_field_arguments, add_written_arguments, field_values
from .placement import add_threads_argument

HELP = {
    "output_dir": "where the checkpoint, loss log and plot are written",
    "steps": "optimizer steps",
    "batch_size": "rows per step",
    "seq_len": "tokens per stream (the model sees twice this)",
    "block_size": "prediction-stream block size B",
    "lr": "peak learning rate (cosine decay after the warm-up)",
    "warmup": "linear warm-up steps",
    "ar_weight": "weight of the memory-stream next-token loss",
    "low_entropy_share": "share of rows from generated sequences",
    "code_chars": "stdlib characters read for the tokenizer and rows",
    "vocab_size": "tokenizer vocabulary",
    "hidden_size": "model width",
    "layers": "decoder layers",
    "intermediate_size": "MLP width",
    "eval_every": "steps between held-out loss evaluations",
    "save_every": "steps between saves of the checkpoint so far (0: end only)",
    "seed": "seed of the corpus, the initialisation and the masking",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_field_arguments(parser, TrainOptions, HELP)
    add_threads_argument(parser)  # TrainOptions.threads, set by the command line's rule
    add_written_arguments(parser, "generation_config.json")
    parser.add_argument(
        "--no-evaluate", action="store_true", help="skip the end-of-run decoding evaluation that chooses the default"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..training.recipe import train

    summary = train(TrainOptions(**field_values(args, TrainOptions, exclude=("evaluate",)), evaluate=not args.no_evaluate))
    print(
        f"{summary['steps_done']} steps, {summary['parameters']} parameters, {summary['wall_seconds']:.0f} s: "
        f"wrote {summary['arguments']['output_dir']} (details: training_log.json, evaluation.md)"
    )
    print(f"default decoding: {DefaultDecoding(**summary['default_decoding']).sentence()}")
    return 0
