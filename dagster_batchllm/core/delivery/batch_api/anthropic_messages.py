"""A chat-completions body as Anthropic Messages parameters, and a Message as what it answered.

The library renders every chat row as an OpenAI chat-completions body (its request key is the
hash of those bytes), so the Anthropic batch protocol translates each body when it writes the
row's line, and each Message of the results back into the text, usage and finish reason the
ledger keeps. What the Messages API cannot express fails the row with the reason
(:class:`CannotExpress`); nothing is silently dropped, since a dropped field (a seed, a penalty,
``detail="low"``) would be an answer to another request than the one the key names.
"""

from __future__ import annotations

from typing import Any

from ...usage import TOKEN_CEILING, token_figure

#: Anthropic's image media types; an image of another type cannot be sent.
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: Chat fields with a Messages counterpart (or none needed); any other field fails the row.
_KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "stop", "response_format", "user", "stream", "n"}
#: How a Message's stop_reason reads as an OpenAI finish_reason (what the tasks look at).
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}


class CannotExpress(ValueError):
    """The body holds something the Messages API has no way to say."""


def messages_params(body: Any) -> dict[str, Any]:
    """The Messages API parameters that ask what the chat-completions ``body`` asks."""
    if not isinstance(body, dict):
        raise CannotExpress("the request body is not a JSON object")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise CannotExpress(f"{', '.join(map(repr, unknown))} "
                            f"{'has' if len(unknown) == 1 else 'have'} no Messages API "
                            "counterpart; leave them out for this endpoint")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise CannotExpress("the request names no model")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if type(max_tokens) is not int or max_tokens < 1:
        raise CannotExpress("the Messages API needs max_tokens, a positive integer")
    system, messages = _conversation(body.get("messages"))
    params: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if system is not None:
        params["system"] = system
    params["messages"] = messages
    temperature = body.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 1:
            raise CannotExpress(f"temperature {temperature!r}: Anthropic takes 0 to 1 "
                                "(OpenAI's 0 to 2 is another scale)")
        params["temperature"] = temperature
    if body.get("top_p") is not None:
        params["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop is not None:
        sequences = [stop] if isinstance(stop, str) else stop
        if not (isinstance(sequences, list) and all(isinstance(s, str) for s in sequences)):
            raise CannotExpress(f"stop {stop!r} is neither a string nor a list of strings")
        if sequences:
            params["stop_sequences"] = sequences
    output = _output_config(body.get("response_format"))
    if output is not None:
        params["output_config"] = output
    if body.get("user") is not None:
        params["metadata"] = {"user_id": str(body["user"])}
    if body.get("stream"):
        raise CannotExpress("stream=True: a batch request is answered whole")
    if body.get("n") not in (None, 1):
        raise CannotExpress(f"n={body['n']!r}: the Messages API answers one choice")
    return params


def _conversation(messages: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """System messages (only before the conversation: Anthropic has one system prompt) as
    the top-level ``system``, and the user and assistant turns."""
    if not isinstance(messages, list) or not messages:
        raise CannotExpress("the request has no messages")
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise CannotExpress(f"messages[{i}] is not an object")
        role = message.get("role")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise CannotExpress(f"messages[{i}] has {', '.join(map(repr, extra))}, which "
                                "the Messages API cannot carry")
        if role in ("system", "developer"):
            if turns:
                raise CannotExpress(f"messages[{i}] is a system message after the "
                                    "conversation began; Anthropic takes one system prompt")
            system.append(_system_text(message.get("content"), i))
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": _content(message.get("content"), i, role)})
        else:
            raise CannotExpress(f"messages[{i}] has role {role!r}; the Messages API takes "
                                "user and assistant turns (tool results are not translated)")
    if not turns:
        raise CannotExpress("the request has a system message but no user message")
    return ("\n\n".join(system) if system else None), turns


def _system_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "".join(p["text"] for p in content)
    raise CannotExpress(f"messages[{i}]: a system message of anything but text")


def _content(content: Any, i: int, role: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise CannotExpress(f"messages[{i}] has no text content")
    blocks = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str) and set(part) <= {"type",
                                                                                  "text"}:
            blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and role == "user":
            blocks.append(_image(part, f"messages[{i}].content[{j}]"))
        else:
            raise CannotExpress(f"messages[{i}].content[{j}] is a {kind!r} part, which is "
                                "not translated to the Messages API")
    return blocks


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``image_url`` part as an image block: a data URL's bytes, or an http(s) URL."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or set(part) != {"type", "image_url"} or (
            set(image) - {"url", "detail"}):
        raise CannotExpress(f"{where}: an image part other than {{url, detail}}")
    if image.get("detail") not in (None, "auto", "high"):
        # Anthropic always reads an image at its full resolution (up to its own bound).
        raise CannotExpress(f"{where}: detail={image['detail']!r} has no Anthropic "
                            "counterpart; use 'auto' or 'high'")
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    head, comma, data = url.partition(",")
    media_type = head.removeprefix("data:").removesuffix(";base64")
    if not (comma and head.startswith("data:") and head.endswith(";base64")):
        raise CannotExpress(f"{where}: an image URL that is neither http(s) nor base64 data")
    if media_type not in IMAGE_TYPES:
        raise CannotExpress(f"{where}: an image of type {media_type!r}; Anthropic takes "
                            f"{', '.join(IMAGE_TYPES)}")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": data}}


def _output_config(response_format: Any) -> dict[str, Any] | None:
    if response_format is None or response_format == {"type": "text"}:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        # Anthropic's structured outputs hold to the schema, as strict=True does.
        return {"format": {"type": "json_schema", "schema": spec["schema"]}}
    raise CannotExpress(f"response_format {response_format!r}: Anthropic takes a JSON schema "
                        "(response_format={'type': 'json_schema', 'json_schema': {'schema': "
                        "...}}), not JSON mode")


def message_answer(message: Any) -> tuple[str, int, int, str | None]:
    """A Message's text, prompt tokens (cache reads and writes included, as OpenAI's
    prompt_tokens includes cached tokens), completion tokens and finish reason."""
    if not isinstance(message, dict):
        return "", 0, 0, None
    blocks = message.get("content")
    text = "".join(block.get("text") or "" for block in blocks
                   if isinstance(block, dict) and block.get("type") == "text"
                   ) if isinstance(blocks, list) else ""
    usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
    # A figure that is no token count reads as the ceiling, which the run holds to the
    # request's bound (core/usage.py): the worst case, never a crash or a negative cost.
    prompt = min(TOKEN_CEILING, sum(_figure(usage, name) for name in (
        "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")))
    reason = message.get("stop_reason")
    return (text, prompt, _figure(usage, "output_tokens"), FINISH_REASONS.get(reason, reason))


def _figure(usage: dict[str, Any], name: str) -> int:
    value = usage.get(name)
    return 0 if value is None else token_figure(value)


def cache_read_tokens(message: Any) -> int:
    """A Message's prompt tokens read from Anthropic's prompt cache (``cache_read_input_tokens``,
    OpenAI's ``cached_tokens``): they cost the cached price."""
    usage = message.get("usage") if isinstance(message, dict) else None
    cached = usage.get("cache_read_input_tokens") if isinstance(usage, dict) else None
    return 0 if cached is None else token_figure(cached, default=0)


def chat_reply(message: Any) -> dict[str, Any]:
    """A Message as the chat completion the chat route's reader reads."""
    text, prompt, completion, reason = message_answer(message)
    model = message.get("model") if isinstance(message, dict) else None
    return {"object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": reason,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cache_read_tokens(message)}}}


__all__ = ["FINISH_REASONS", "IMAGE_TYPES", "CannotExpress", "cache_read_tokens", "chat_reply",
           "message_answer", "messages_params"]
