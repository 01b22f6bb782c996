"""Chat and legacy completions: validate a request body and build its reply.

Pure functions of (`Serving`, body): the online routes and the simulator's batch runner both
call them, so a batch line gets the same answer as the same body sent online.

Usage: prompt tokens are one per 4 characters of each message's text parts (rounded up) plus
4 per message, plus `IMAGE_TOKENS` (85, OpenAI's low-detail cost) per image part; completion
tokens are one per 4 characters of the reply, times ``n``. When the state holds a prefix cache
(`ServingState.prefill`; the simulator's ``prefix_cache_tokens``) the usage says how many
prompt tokens it held (``prompt_tokens_details.cached_tokens``, OpenAI's and vLLM's field), and
the request carries the latency the rest adds (``prefill_s``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .images import IMAGE_TOKENS, ImagePart, parse_content
from .protocol import Reject, Serving, tokens
from .responder import prompt_text

DEFAULT_MAX_TOKENS = 256


@dataclass
class Generation:
    """A validated chat or completions request and the reply it gets."""

    body: dict
    chat: bool
    model: str
    prompt_tokens: int
    text: str
    finish: str
    n: int
    images: list[ImagePart] = field(default_factory=list)
    prompt: str = ""  # the last user message as the responder read it
    cached_tokens: int | None = None  # None: no prefix cache, the usage leaves the field out
    prefill_s: float = 0.0  # latency added for the prompt tokens not cached
    # OpenAI's choices[].logprobs.content, when the request asked logprobs=true and the
    # responder gives them (see labelled.py); None: the reply says "logprobs": null
    logprobs: list | None = None

    @property
    def cost(self) -> int:
        """The tokens the request costs: its prompt and its whole reply."""
        return self.prompt_tokens + tokens(self.text) * self.n

    def render(self, serving: Serving) -> tuple[dict, dict | None]:
        """The reply body and the usage counted for it."""
        completion_tokens = tokens(self.text) * self.n
        payload = completion_payload(self.chat, f"{next(serving.ids)}", self.model, self.text,
                                     self.finish, self.n, self.prompt_tokens, completion_tokens,
                                     self.cached_tokens, self.logprobs)
        payload["usage"] = serving.state.reported_usage(payload["usage"])
        return payload, {"prompt_tokens": self.prompt_tokens,
                         "completion_tokens": completion_tokens}


@dataclass
class Prompt:
    """A request's prompt as the server reads it: the messages the responder sees (a
    completions prompt is one user message), its images, its token count (the usage's
    ``prompt_tokens``, and ``/tokenize``'s ``count``) and its parts laid out for the prefix
    cache."""

    messages: list[dict]
    images: list[ImagePart]
    tokens: int
    laid_out: list[tuple[str, str]]


def read_prompt(body: dict, chat: bool, max_image_bytes: int) -> Prompt:
    """The prompt of a chat (``messages``) or completions (``prompt``) body, validated."""
    if chat:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
            raise Reject(400, "'messages' must be a non-empty list of objects")
        messages, images, count, laid_out = [], [], 0, []
        for message in raw:
            role = message.get("role", "user")
            content = parse_content(message.get("content"), role, max_image_bytes)
            messages.append({"role": role, "content": content.text})
            images.extend(content.images)
            count += tokens(content.token_text) + 4 + IMAGE_TOKENS * len(content.images)
            laid_out.append((role, content.token_text
                             + "".join(f"<image:{i.sha256}>" for i in content.images)))
        return Prompt(messages, images, count, laid_out)
    text = body.get("prompt", "")
    text = "\n".join(map(str, text)) if isinstance(text, list) else str(text)
    return Prompt([{"role": "user", "content": text}], [], tokens(text), [("prompt", text)])


def tokenize_reply(serving: Serving, body: object) -> dict:
    """vLLM's ``POST /tokenize`` answered by count: ``{"model", "messages"}`` (a chat prompt,
    as ``/v1/chat/completions`` would count it) or ``{"model", "prompt"}``; the reply's
    ``count`` is the ``prompt_tokens`` the same request's usage reports. (vLLM's reply also
    lists the token ids; this server's tokenizer is a count, so it lists none.)"""
    if not isinstance(body, dict):
        raise Reject(400, "request body must be a JSON object")
    serving.check_model(body.get("model"), embeddings=False)
    config = serving.state.config
    prompt = read_prompt(body, "messages" in body, config["max_image_bytes"])
    # As its replies' usage would say it (a simulator told to misreport does so here too).
    count = serving.state.reported_usage({"prompt_tokens": prompt.tokens})["prompt_tokens"]
    return {"count": count, "max_model_len": config["max_context_tokens"] or None,
            "tokens": []}


def prepare_generation(serving: Serving, body: object, chat: bool) -> Generation:
    """Validate a request and build its reply text (cut to max_tokens unless structured)."""
    if not isinstance(body, dict):
        raise Reject(400, "request body must be a JSON object")
    model = serving.check_model(body.get("model"), embeddings=False)
    if body.get("stream"):
        raise Reject(400, "streaming is not supported by this server")
    config = serving.state.config
    prompt = read_prompt(body, chat, config["max_image_bytes"])
    messages, images, prompt_tokens = prompt.messages, prompt.images, prompt.tokens
    params = {k: v for k, v in body.items() if k not in ("model", "messages", "prompt")}
    requested = body.get("max_completion_tokens")
    if requested is None:
        requested = body.get("max_tokens")
    if requested is not None and (type(requested) is not int or requested < 0):
        raise Reject(400, "max_tokens must be an integer")
    limit = config["max_context_tokens"]
    if limit and (prompt_tokens + (requested or 0) > limit or prompt_tokens >= limit):
        asked = prompt_tokens + (requested or 0)
        raise Reject(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{asked} tokens ({prompt_tokens} in the messages, {requested or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
            "context_length_exceeded",
        )
    if requested is None:  # like vLLM: what is left of the context, capped by our default
        requested = DEFAULT_MAX_TOKENS
        if limit:
            requested = min(requested, limit - prompt_tokens)
    text = serving.responder.respond(model, messages, params)
    fmt = body.get("response_format")
    structured = isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")
    finish = "stop"
    if not structured and tokens(text) > requested:
        text, finish = text[: max(requested, 0) * 4], "length"
    n = body.get("n") or 1
    n = n if isinstance(n, int) and n > 0 else 1
    cached, prefill_s = serving.state.prefill(prompt.laid_out, prompt_tokens)
    scorer = getattr(serving.responder, "logprobs", None)
    logprobs = (scorer(model, messages, params, text)
                if chat and body.get("logprobs") is True and callable(scorer) else None)
    return Generation(body, chat, model, prompt_tokens, text, finish, n, images,
                      prompt_text(messages) if images else "", cached, prefill_s, logprobs)


def completion_payload(chat: bool, serial: str, model: str, text: str, finish: str, n: int,
                       prompt_tokens: int, completion_tokens: int,
                       cached_tokens: int | None = None, logprobs: list | None = None) -> dict:
    if chat:
        kind, prefix = "chat.completion", "chatcmpl-sim"
        scored = None if logprobs is None else {"content": logprobs}
        choices = [{"index": i, "message": {"role": "assistant", "content": text},
                    "finish_reason": finish, "logprobs": scored} for i in range(n)]
    else:
        kind, prefix = "text_completion", "cmpl-sim"
        choices = [{"index": i, "text": text, "finish_reason": finish, "logprobs": None}
                   for i in range(n)]
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return {"id": f"{prefix}{serial}", "object": kind, "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage}
