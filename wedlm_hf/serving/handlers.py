"""transformers serve's endpoint handlers, with what `wedlm-hf serve` changes in them (`ServeHooks` has the server
build these): every request field served or refused by name (fields.py), a request's sampling fields with OpenAI's
meaning (requests.py), its size bounded before it is tokenized (prompts.py), `n` choices with echoed prompts and
log-probabilities (choices.py, responses.py), the completions API's token-id and list prompts, the model named in
responses as the user named it to `serve` (transformers names a Hub model `name@main`), and streamed errors in
OpenAI's shape."""

import json

from fastapi.responses import JSONResponse, StreamingResponse
from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.completion import CompletionHandler
from transformers.cli.serving.response import ResponseHandler

from .choices import OPTIONS_ATTRIBUTE, Choice, ChoiceManager, Prompt, ResponseOptions, plan_choices
from .errors import invalid_request, openai_stream_errors
from .fields import CHAT_COMPLETIONS, COMPLETIONS, check_fields, log_end_user
from .prompts import check_text_size, completion_prompts, message_characters
from .requests import READ_HERE, apply_request_fields, names_budget
from .responses import joined_response, merged_stream
from .streamers import TokenText


class OpenAIRequests:
    """Mixed in before a transformers handler: the fields of `requests.READ_HERE` are read here, the others there;
    with `accepted_fields`, every field is checked against fields.py first."""

    accepted_fields: set[str] | None = None

    def _validate_request(self, body: dict) -> None:
        """fields.py's check; transformers' then sees neither the fields read here nor, checked, those it would
        log as ignored (they are served or were refused)."""
        skipped = set(READ_HERE)
        if self.accepted_fields is not None:
            check_fields(body, self.accepted_fields)
            skipped |= self._unused_fields
        super()._validate_request({name: value for name, value in body.items() if name not in skipped})

    def _build_generation_config(self, body: dict, model_generation_config, use_cb: bool = False):
        others = {name: value for name, value in body.items() if name not in READ_HERE}
        config = super()._build_generation_config(others, model_generation_config, use_cb=use_cb)
        apply_request_fields(body, config)
        if use_cb and self.generation_state.batching is not None and not names_budget(body):
            config.max_new_tokens = None  # WeDLM's continuous batching gives as many tokens as fit
        return config

    def _resolve_model(self, body: dict):
        """The model, as the user named it; a request for another, or one whose messages cannot fit the model's
        positions, is refused naming the field (before anything is tokenized)."""
        try:
            model_id, model, processor = super()._resolve_model(body)
        except Exception as error:  # the server is pinned to another model
            if getattr(error, "status_code", None) == 400:
                error.param = "model"
            raise
        if "messages" in body:
            tokenizer = getattr(processor, "tokenizer", processor)
            check_text_size(message_characters(body["messages"]), model, tokenizer, "messages")
            if body.get("tools"):
                _check_tools_render(processor)
        return self.model_manager.force_model or model_id, model, processor


def _check_tools_render(processor) -> None:
    """Refuse `tools` that the chat template would leave out of the prompt (the model would never see them)."""
    probe = [{"role": "user", "content": "?"}]
    tool = {"type": "function", "function": {"name": "probe", "description": "?", "parameters": {"type": "object"}}}
    render = lambda **tools: processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **tools)
    if render() == render(tools=[tool]):
        raise invalid_request("`tools`: this model's chat template does not show tools to the model; drop them.",
                              "tools")


class OpenAIChoices:
    """Mixed in first: a request's choices (each prompt `n` times) answered by the transformers handler one by
    one, joined into one response (responses.py), with echoed prompts and log-probabilities."""

    chat = False

    def _build_generation_config(self, body: dict, model_generation_config, use_cb: bool = False):
        config = super()._build_generation_config(body, model_generation_config, use_cb=use_cb)
        setattr(config, OPTIONS_ATTRIBUTE, ResponseOptions.read(body, chat=self.chat))
        return config

    def _choices(self, request_id: str, model, processor, inputs, gen_config) -> tuple[list[Choice], ResponseOptions]:
        options = gen_config.__dict__.pop(OPTIONS_ATTRIBUTE)
        log_end_user(request_id, options.end_user)
        if not isinstance(inputs, list):  # the chat handler's one prompt
            ids = inputs["input_ids"]
            inputs = [Prompt(ids.flatten().tolist() if hasattr(ids, "flatten") else list(ids), inputs)]
        tokenizer = getattr(processor, "tokenizer", processor)
        return plan_choices(request_id, inputs, gen_config, options, model, tokenizer), options

    async def _non_streaming(self, request_id, model, processor, model_id, inputs, gen_config, gen_manager, **kwargs):
        choices, options = self._choices(request_id, model, processor, inputs, gen_config)
        answer = super()._non_streaming

        def answer_one(choice: Choice):
            manager, inputs = ChoiceManager(gen_manager, choice), choice.prompt.inputs
            return answer(choice.request_id, model, processor, model_id, inputs, choice.config, manager, **kwargs)

        return JSONResponse(await joined_response(request_id, choices, answer_one, options))

    def _streaming(self, request_id, model, processor, model_id, inputs, gen_config, gen_manager, **kwargs):
        choices, options = self._choices(request_id, model, processor, inputs, gen_config)
        start = super()._streaming

        def start_one(choice: Choice):
            manager, inputs = ChoiceManager(gen_manager, choice, options.stops), choice.prompt.inputs
            return start(choice.request_id, model, processor, model_id, inputs, choice.config, manager, **kwargs)

        def echo(choice: Choice, prompt_scores) -> str:
            piece = TokenText(choice.prompt.text, choice.prompt.ids)
            piece.logprobs = choice.logprobs(prompt_scores) if choice.scorer is not None else None
            return self._build_chunk_sse(request_id, model_id, text=piece)

        events = merged_stream(request_id, choices, start_one, echo if options.echo else None, options)
        return StreamingResponse(events, media_type="text/event-stream")

    def _build_chunk_sse(self, *args, **kwargs) -> str:
        """transformers' chunk, with the log-probabilities of the streamed piece it carries."""
        event = super()._build_chunk_sse(*args, **kwargs)
        logprobs = getattr(kwargs.get("text", kwargs.get("content")), "logprobs", None)
        if logprobs is None:
            return event
        data = json.loads(event.removeprefix("data: "))
        data["choices"][0]["logprobs"] = logprobs
        return f"data: {json.dumps(data)}\n\n"


class OpenAIStreamErrors:
    """Mixed in before a transformers handler that streams its errors as `data: {"error": "<message>"}`."""

    def _streaming(self, *args, **kwargs):
        response = super()._streaming(*args, **kwargs)
        response.body_iterator = openai_stream_errors(response.body_iterator)
        return response


class WeDLMChatCompletionHandler(OpenAIChoices, OpenAIRequests, OpenAIStreamErrors, ChatCompletionHandler):
    """`/v1/chat/completions`."""

    chat = True
    accepted_fields = CHAT_COMPLETIONS


class WeDLMCompletionHandler(OpenAIChoices, OpenAIRequests, OpenAIStreamErrors, CompletionHandler):
    """`/v1/completions`: the prompt in each of the API's forms (transformers' handler takes a string alone)."""

    accepted_fields = COMPLETIONS

    async def handle_request(self, body: dict, request_id: str):
        self._validate_request(body)
        model_id, model, processor = self._resolve_model(body)
        modality = self.model_manager.get_model_modality(model, processor=processor)
        use_cb = self.generation_state.use_continuous_batching(model, modality)
        gen_manager = self.generation_state.get_manager(model_id, use_cb=use_cb)
        tokenizer = getattr(processor, "tokenizer", processor)
        prompts = completion_prompts(body.get("prompt", ""), model, tokenizer, use_cb)
        gen_config = self._build_generation_config(body, model.generation_config, use_cb=use_cb)
        if use_cb:
            gen_manager.init_cb(model, gen_config)
        if body.get("stream"):
            return self._streaming(request_id, model, processor, model_id, prompts, gen_config, gen_manager)
        return await self._non_streaming(request_id, model, processor, model_id, prompts, gen_config, gen_manager)


class WeDLMResponseHandler(OpenAIRequests, ResponseHandler):
    """`/v1/responses` (its streamed errors are already events of the Responses API)."""
