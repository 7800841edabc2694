"""The Gradio page: prompt, model chooser and decoding sliders; WeDLM and autoregressive outputs streaming side by
side with their speed; and the step view showing which forward filled and committed each WeDLM token."""

import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # read when gradio is imported; the demo phones nobody

import gradio as gr

import wedlm_hf

from .engine import SideProgress, StopRegistry, load_generation_config, load_model, race
from .logic import (
    CHECKPOINT_KEYS,
    EXAMPLES,
    SLIDERS,
    InputError,
    checkpoint_defaults,
    format_stats,
    format_verdict,
    lossless_default,
    validate_params,
    validate_prompt,
)
from .step_view import STEP_VIEW_CSS, render_step_view

PAPER_URL = "https://arxiv.org/abs/2512.22737"
NAMES = {"wedlm": "WeDLM", "ar": "Autoregressive"}

THEME = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
"""System fonts only: the default theme fetches web fonts, which an offline machine would wait on."""


def _model_choices(default_model: str) -> list[tuple[str, str]]:
    embedded = wedlm_hf.DEFAULT_MODEL
    label = "embedded wedlm-tiny-code" + ("" if Path(embedded).is_dir() else " (not trained yet)")
    choices = [(label, embedded)]
    if default_model != embedded:
        choices.insert(0, (default_model, default_model))
    return choices


def _side_views(name: str, state: SideProgress, tokenizer, stopped: bool) -> tuple[str, str]:
    """The side's text so far and its stats line; forwards are known once it is done."""
    text = tokenizer.decode(state.token_ids, skip_special_tokens=True)
    if state.error is not None:
        return text, f"**{NAMES[name]}** failed: {state.error}"
    forwards = None
    if state.done:
        stats = getattr(state.output, "wedlm_stats", None)
        forwards = stats.model_calls if stats is not None else len(state.token_ids)  # AR: one forward per token
    note = "stopped" if stopped and state.done else ("" if state.done else "running…")
    return text, format_stats(NAMES[name], len(state.token_ids), state.seconds, forwards, note)


def _step_view(state: SideProgress, tokenizer, window_size: int) -> str:
    """The step view of a finished WeDLM run (empty until then: the traces come with the output)."""
    stats = getattr(state.output, "wedlm_stats", None)
    if stats is None:
        return ""
    count = stats.generated[0]
    sequence = state.output.sequences[0]
    token_ids = sequence[sequence.shape[0] - count :].tolist() if count else []
    tokens = [tokenizer.decode([token_id]) for token_id in token_ids]
    return render_step_view(tokens, stats.fill_steps[0], stats.commit_steps[0], window_size, stats.model_calls)


def _verdict(progress: dict[str, SideProgress], sampled: bool) -> str:
    """Speed-up and agreement of a run both of whose sides finished; a failed side leaves nothing to compare."""
    wedlm, ar = progress["wedlm"], progress["ar"]
    stats = getattr(wedlm.output, "wedlm_stats", None)
    if stats is None or ar.error is not None:
        return ""
    return format_verdict(
        wedlm.token_ids, wedlm.seconds, ar.token_ids, ar.seconds, stats.tokens_per_forward[0], sampled
    )


def _default_updates(model_name: str) -> list:
    """The window sliders and the lossless checkbox set to `model_name`'s generation config, and the line saying
    where the values came from."""
    config = load_generation_config(model_name)
    values, note = checkpoint_defaults(config)
    sliders = [gr.update(value=values[name]) for name in CHECKPOINT_KEYS]
    return [*sliders, note, gr.update(value=lossless_default(config))]


def build_app(default_model: str | None = None, concurrency_limit: int = 1, queue_size: int = 16) -> gr.Blocks:
    """The demo page: `concurrency_limit` generations run at once (two threads each), `queue_size` more may wait."""
    default_model = default_model or wedlm_hf.DEFAULT_MODEL
    runs = StopRegistry()

    def generate(
        prompt: str,
        model_name: str,
        window_size: float,
        entropy_threshold: float,
        pos_penalty_factor: float,
        temperature: float,
        max_new_tokens: float,
        lossless: bool,
        request: gr.Request,
    ):
        session = request.session_hash if request is not None else ""
        cleared = ("",) * 6  # both texts, both stats, the step view and the verdict: nothing of an earlier run stays
        try:
            prompt = validate_prompt(prompt)
            params = validate_params(
                window_size, entropy_threshold, pos_penalty_factor, temperature, max_new_tokens, lossless
            )
            yield f"Loading `{model_name}`…", *cleared
            model, tokenizer = load_model(model_name)
        except InputError as error:
            gr.Warning(str(error))
            yield f"⚠️ {error}", *cleared
            return
        except Exception as error:  # a wrong path, a Hub id that cannot be reached, an unsupported architecture
            message = f"Could not load model `{model_name}`: {type(error).__name__}: {error}"
            gr.Warning(message)
            yield f"⚠️ {message}", *cleared
            return
        stop = runs.start(session)
        steps_shown = False
        try:
            for progress in race(model, tokenizer, prompt, params, stop):
                stopped = stop.is_set()
                wedlm_text, wedlm_stats = _side_views("wedlm", progress["wedlm"], tokenizer, stopped)
                ar_text, ar_stats = _side_views("ar", progress["ar"], tokenizer, stopped)
                finished = all(state.done for state in progress.values())
                status = ("Stopped." if stopped else "Done.") if finished else f"Decoding with `{model_name}`…"
                steps = gr.skip()  # rendered once, when the WeDLM side is done: it is the largest update
                if progress["wedlm"].done and not steps_shown:
                    steps, steps_shown = _step_view(progress["wedlm"], tokenizer, params.window_size), True
                verdict = _verdict(progress, params.temperature > 0) if finished and not stopped else ""
                yield status, wedlm_text, wedlm_stats, ar_text, ar_stats, steps, verdict
        finally:
            runs.finish(session, stop)

    def stop_generation(request: gr.Request) -> None:
        """Set the session's stop flag. The run itself ends at its next token or commit and reports "Stopped.":
        cancelling the Gradio event instead would race its last yields against this handler's status."""
        if not runs.stop(request.session_hash):
            gr.Info("Nothing is running.")

    default_config = load_generation_config(default_model)
    defaults, defaults_line = checkpoint_defaults(default_config)
    with gr.Blocks(title="WeDLM parallel decoding", analytics_enabled=False) as app:
        gr.Markdown(
            "# WeDLM parallel decoding\n"
            f"[WeDLM]({PAPER_URL}) decodes a window of mask slots after the text with ordinary causal attention and "
            "commits several tokens per forward, keeping a normal KV cache. Below, the same model continues your "
            "prompt twice at once: left with WeDLM, right with ordinary autoregressive (AR) decoding, one token per "
            "forward. The embedded model is a 3.5M-parameter toy trained on Python source and counting: other text "
            "gives noise."
        )
        with gr.Row():
            prompt = gr.Textbox(EXAMPLES[0].prompt, label="Prompt", lines=3, scale=3, elem_id="prompt")
            model_name = gr.Dropdown(
                _model_choices(default_model),
                value=default_model,
                allow_custom_value=True,
                label="Model",
                info="the embedded checkpoint, or type a local path or Hub id",
                scale=2,
                elem_id="model",
            )
        gr.Examples(
            [[example.prompt] for example in EXAMPLES],
            inputs=[prompt],
            example_labels=[example.label for example in EXAMPLES],
            label="Examples for the embedded model",
            elem_id="examples",
        )
        with gr.Row():
            sliders = [
                gr.Slider(
                    spec.minimum,
                    spec.maximum,
                    defaults.get(name, spec.default),
                    step=spec.step,
                    label=spec.label,
                    info=spec.info,
                    elem_id=f"slider-{name.replace('_', '-')}",
                )
                for name, spec in SLIDERS.items()
            ]
        defaults_note = gr.Markdown(defaults_line, elem_id="defaults")
        lossless = gr.Checkbox(
            lossless_default(default_config),
            label="Lossless: verify WeDLM drafts against the model's own next-token logits (output identical to AR)",
            elem_id="lossless",
        )
        with gr.Row():
            run_button = gr.Button("Generate", variant="primary", elem_id="run")
            stop_button = gr.Button("Stop", variant="stop", elem_id="stop")
        status = gr.Markdown(elem_id="status")
        with gr.Row(equal_height=True):
            with gr.Column():
                wedlm_text = gr.Textbox(label="WeDLM", lines=8, interactive=False, elem_id="wedlm-output")
                wedlm_stats = gr.Markdown(elem_id="wedlm-stats")
            with gr.Column():
                ar_text = gr.Textbox(label="Autoregressive", lines=8, interactive=False, elem_id="ar-output")
                ar_stats = gr.Markdown(elem_id="ar-stats")
        verdict = gr.Markdown(elem_id="verdict")
        gr.Markdown("### Step view (WeDLM): one row per forward, the window sliding right as tokens commit")
        steps = gr.HTML(elem_id="step-view")

        by_name = dict(zip(SLIDERS, sliders))
        model_name.change(
            _default_updates,
            inputs=[model_name],
            outputs=[*(by_name[name] for name in CHECKPOINT_KEYS), defaults_note, lossless],
        )
        run_button.click(
            generate,
            inputs=[prompt, model_name, *sliders, lossless],
            outputs=[status, wedlm_text, wedlm_stats, ar_text, ar_stats, steps, verdict],
            concurrency_limit=concurrency_limit,
            show_progress="minimal",
        )
        stop_button.click(stop_generation, queue=False)
    app.queue(max_size=queue_size, default_concurrency_limit=concurrency_limit)
    return app


def launch(app: gr.Blocks, host: str | None = None, port: int | None = None, block: bool = True) -> None:
    """Serve `app` without share links or server-side rendering, and print its address in one line (Gradio's own
    start-up lines are silenced: they suggest `share=True`, which the command does not offer). host/port None:
    Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, else 127.0.0.1:7860 (a Space sets the variables).
    `block=False` returns once it serves."""
    app.launch(
        server_name=host,
        server_port=port,
        share=False,
        quiet=True,
        ssr_mode=False,
        show_error=True,
        theme=THEME,
        css=STEP_VIEW_CSS,
        footer_links=["gradio"],
        prevent_thread_lock=True,
    )
    print(f"demo on {app.local_url} (Ctrl-C stops)", flush=True)
    if block:
        app.block_thread()
