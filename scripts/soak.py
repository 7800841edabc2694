"""1,000 consecutive WeDLM generate calls on the embedded checkpoint: RSS growth and first-vs-last output."""

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import wedlm_hf
from wedlm_hf.bench.soak import soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=wedlm_hf.DEFAULT_MODEL)
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    report = soak(model, tokenizer, args.calls)
    print(
        f"calls={report.calls} rss_after_warmup={report.rss_after_warmup_mb:.1f}MB rss_end={report.rss_end_mb:.1f}MB "
        f"growth={report.growth_mb:+.1f}MB peak={report.rss_peak_mb:.1f}MB first_equals_last={report.first_equals_last}"
    )


if __name__ == "__main__":
    main()
