"""transformers serve's endpoint handlers, with what `wedlm-hf serve` changes in them (`ServeHooks` has the server
build these): a request's sampling fields with OpenAI's meaning (requests.py), the model named in responses as the
user named it to `serve` (transformers names a Hub model `name@main`), and streamed errors in OpenAI's shape."""

from transformers.cli.serving.chat_completion import ChatCompletionHandler
from transformers.cli.serving.completion import CompletionHandler
from transformers.cli.serving.response import ResponseHandler

from .errors import openai_stream_errors
from .requests import FIELDS, apply_request_fields, names_budget


class OpenAIRequests:
    """Mixed in before a transformers handler: the fields of `requests.FIELDS` are read here, the others there."""

    def _validate_request(self, body: dict) -> None:
        super()._validate_request({name: value for name, value in body.items() if name not in FIELDS})

    def _build_generation_config(self, body: dict, model_generation_config, use_cb: bool = False):
        others = {name: value for name, value in body.items() if name not in FIELDS}
        config = super()._build_generation_config(others, model_generation_config, use_cb=use_cb)
        apply_request_fields(body, config)
        if use_cb and self.generation_state.batching is not None and not names_budget(body):
            config.max_new_tokens = None  # WeDLM's continuous batching gives as many tokens as fit
        return config

    def _resolve_model(self, body: dict):
        model_id, model, processor = super()._resolve_model(body)
        return self.model_manager.force_model or model_id, model, processor


class OpenAIStreamErrors:
    """Mixed in before a transformers handler that streams its errors as `data: {"error": "<message>"}`."""

    def _streaming(self, *args, **kwargs):
        response = super()._streaming(*args, **kwargs)
        response.body_iterator = openai_stream_errors(response.body_iterator)
        return response


class WeDLMChatCompletionHandler(OpenAIRequests, OpenAIStreamErrors, ChatCompletionHandler):
    """`/v1/chat/completions`."""


class WeDLMCompletionHandler(OpenAIRequests, OpenAIStreamErrors, CompletionHandler):
    """`/v1/completions`."""


class WeDLMResponseHandler(OpenAIRequests, ResponseHandler):
    """`/v1/responses` (its streamed errors are already events of the Responses API)."""
