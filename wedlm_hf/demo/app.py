"""The Gradio page: prompt, model chooser and decoding sliders; WeDLM and autoregressive outputs streaming side by
side with their speed; and the step view showing which forward filled and committed each WeDLM token."""

import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # read when gradio is imported; the demo phones nobody

import gradio as gr

import wedlm_hf

from .engine import SideProgress, StopRegistry, load_model, race
from .logic import (
    SLIDERS,
    STEP_VIEW_CSS,
    InputError,
    format_stats,
    render_step_view,
    validate_params,
    validate_prompt,
)

EXAMPLE_PROMPT = "1, 2, 3, 4, 5, 6, 7, 8,"
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


def build_app(default_model: str | None = None, concurrency_limit: int = 1, queue_size: int = 16) -> gr.Blocks:
    """The demo page: `concurrency_limit` generations run at once (two threads each), `queue_size` more may wait."""
    default_model = default_model or wedlm_hf.DEFAULT_MODEL
    runs = StopRegistry()

    def generate(
        prompt: str,
        model_name: str,
        window_size: float,
        entropy_threshold: float,
        pos_penalty: float,
        temperature: float,
        max_new_tokens: float,
        lossless: bool,
        request: gr.Request,
    ):
        session = request.session_hash if request is not None else ""
        try:
            prompt = validate_prompt(prompt)
            params = validate_params(
                window_size, entropy_threshold, pos_penalty, temperature, max_new_tokens, lossless
            )
            yield f"Loading `{model_name}`…", "", "", "", "", ""
            model, tokenizer = load_model(model_name)
        except InputError as error:
            gr.Warning(str(error))
            yield f"⚠️ {error}", *(gr.skip(),) * 5
            return
        except Exception as error:  # a wrong path, a Hub id that cannot be reached, an unsupported architecture
            message = f"Could not load model `{model_name}`: {type(error).__name__}: {error}"
            gr.Warning(message)
            yield f"⚠️ {message}", *(gr.skip(),) * 5
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
                yield status, wedlm_text, wedlm_stats, ar_text, ar_stats, steps
        finally:
            runs.finish(session, stop)

    def stop_generation(request: gr.Request) -> None:
        """Set the session's stop flag. The run itself ends at its next token or commit and reports "Stopped.":
        cancelling the Gradio event instead would race its last yields against this handler's status."""
        if not runs.stop(request.session_hash):
            gr.Info("Nothing is running.")

    with gr.Blocks(title="WeDLM parallel decoding", analytics_enabled=False) as app:
        gr.Markdown(
            "# WeDLM parallel decoding\n"
            "The same model continues your prompt twice at once: left with WeDLM (several tokens per forward from a "
            "sliding window of mask slots), right with ordinary autoregressive decoding (one token per forward)."
        )
        with gr.Row():
            prompt = gr.Textbox(EXAMPLE_PROMPT, label="Prompt", lines=3, scale=3, elem_id="prompt")
            model_name = gr.Dropdown(
                _model_choices(default_model),
                value=default_model,
                allow_custom_value=True,
                label="Model",
                info="the embedded checkpoint, or type a local path or Hub id",
                scale=2,
                elem_id="model",
            )
        with gr.Row():
            sliders = [
                gr.Slider(
                    spec.minimum,
                    spec.maximum,
                    spec.default,
                    step=spec.step,
                    label=spec.label,
                    info=spec.info,
                    elem_id=f"slider-{name.replace('_', '-')}",
                )
                for name, spec in SLIDERS.items()
            ]
        lossless = gr.Checkbox(
            False,
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
        gr.Markdown("### Step view (WeDLM): one row per forward, the window sliding right as tokens commit")
        steps = gr.HTML(elem_id="step-view")

        run_button.click(
            generate,
            inputs=[prompt, model_name, *sliders, lossless],
            outputs=[status, wedlm_text, wedlm_stats, ar_text, ar_stats, steps],
            concurrency_limit=concurrency_limit,
            show_progress="minimal",
        )
        stop_button.click(stop_generation, queue=False)
    app.queue(max_size=queue_size, default_concurrency_limit=concurrency_limit)
    return app


def launch(app: gr.Blocks, host: str | None = None, port: int | None = None) -> None:
    """Serve `app` without share links or server-side rendering. host/port None: Gradio's GRADIO_SERVER_NAME /
    GRADIO_SERVER_PORT, else 127.0.0.1:7860 (a Space sets the variables)."""
    app.launch(
        server_name=host,
        server_port=port,
        share=False,
        ssr_mode=False,
        show_error=True,
        theme=THEME,
        css=STEP_VIEW_CSS,
        footer_links=["gradio"],
    )
