"""``POST /v1/embeddings``: deterministic vectors, validated as OpenAI and vLLM do.

Each input text gets a vector seeded by its hash (SHAKE-256 of the UTF-8 text): the same text
always gets the same vector, in every process. Vectors are L2-normalised float32 of
``embedding_dimensions`` components; ``dimensions`` keeps the first components and
re-normalises (a 400 above the model's size). ``encoding_format`` "float" (the default) sends
numbers; "base64" sends the little-endian float32 bytes, base64-encoded, which is what the
openai client asks for by default and decodes. ``embedding_base64=False`` refuses base64, so
a client's fallback to floats can be tested.

Usage: ``prompt_tokens`` (= ``total_tokens``) is one token per 4 characters of each input,
rounded up. Validation (all 400s): token-id arrays, an empty input, more than
``max_inputs_per_request`` inputs, and an input over the context limit, whose message names
the input as ``input[i]`` so a client can split the request and fail only that row.

A responder that embeds (an ``embedding_models()`` list and ``embed(model, texts, dimensions)``
returning a float32 matrix, as the embedded default's ``ClassicalResponder``) computes the
vectors of its models instead; validation and usage stay the server's.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from .protocol import Reject, Serving, tokens
from .responder import responder_embedding_models


def embedding_vectors(texts: list[str], dimensions: int, model_dimensions: int) -> np.ndarray:
    """The texts' L2-normalised float32 vectors (little-endian), one row each. Components in
    [-1, 1) come from each text's hash; one numpy pass for a whole request keeps the server's
    CPU per input (~4 us) small beside a client's."""
    raw = b"".join(hashlib.shake_256(text.encode("utf-8")).digest(4 * model_dimensions)
                   for text in texts)
    full = np.frombuffer(raw, dtype="<u4").reshape(len(texts), model_dimensions)
    head = full[:, :dimensions] / 2147483648.0 - 1.0
    norms = np.sqrt(np.einsum("ij,ij->i", head, head))
    norms[norms == 0] = 1.0
    return (head / norms[:, None]).astype("<f4")


def embedding_vector(text: str, dimensions: int, model_dimensions: int) -> bytes:
    """One text's vector as little-endian float32 bytes."""
    return embedding_vectors([text], dimensions, model_dimensions)[0].tobytes()


@dataclass
class EmbeddingJob:
    """A validated embeddings request."""

    body: dict
    model: str
    inputs: list[str]
    dimensions: int
    model_dimensions: int
    base64: bool
    prompt_tokens: int
    #: The responder's vectors (little-endian float32 bytes per input), where it embeds.
    vectors: list[bytes] | None = None

    @property
    def cost(self) -> int:
        """The tokens the request costs: its inputs'."""
        return self.prompt_tokens

    def packed_vectors(self) -> list[bytes]:
        """Each input's vector, as little-endian float32 bytes."""
        if self.vectors is not None:
            return self.vectors
        return [row.tobytes() for row in
                embedding_vectors(self.inputs, self.dimensions, self.model_dimensions)]

    def render(self, serving: Serving) -> tuple[dict, dict | None]:
        """The reply body and the usage counted for it (see `Generation`)."""
        size, data = self.dimensions, []
        for index, packed in enumerate(self.packed_vectors()):
            packed = packed[: 4 * size]
            vector = (base64.b64encode(packed).decode() if self.base64
                      else list(struct.unpack(f"<{size}f", packed)))
            data.append({"object": "embedding", "index": index, "embedding": vector})
        usage = serving.state.reported_usage(
            {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens})
        payload = {"object": "list", "data": data, "model": self.model, "usage": usage}
        return payload, {"prompt_tokens": self.prompt_tokens, "inputs": len(self.inputs)}


def prepare_embeddings(serving: Serving, body: object) -> EmbeddingJob:
    if not isinstance(body, dict):
        raise Reject(400, "request body must be a JSON object")
    model = serving.check_model(body.get("model"), embeddings=True)
    config = serving.state.config
    inputs = _inputs(body.get("input"), int(config["max_inputs_per_request"]))
    model_dimensions = int(config["embedding_dimensions"])
    dimensions = body.get("dimensions")
    if dimensions is None:
        dimensions = model_dimensions
    elif type(dimensions) is not int or not 1 <= dimensions <= model_dimensions:
        raise Reject(400, f"dimensions must be an integer from 1 to {model_dimensions} for "
                          f"model `{model}`, got {dimensions!r}", "invalid_value", "dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise Reject(400, f"encoding_format must be 'float' or 'base64', got {encoding!r}",
                     "invalid_value", "encoding_format")
    if encoding == "base64" and not config["embedding_base64"]:
        raise Reject(400, "encoding_format base64 not supported", "invalid_value",
                     "encoding_format")
    limit = config["embedding_max_context_tokens"] or config["max_context_tokens"]
    counts = [tokens(text) for text in inputs]
    for index, count in enumerate(counts):
        if limit and count > limit:
            raise Reject(400, f"input[{index}] has {count} tokens, over this model's maximum "
                              f"context length of {limit} tokens. Please reduce the length of "
                              "the input.", "context_length_exceeded", "input")
    job = EmbeddingJob(body, model, inputs, dimensions, model_dimensions, encoding == "base64",
                       sum(counts))
    if model in responder_embedding_models(serving.responder):
        # The responder's model (the embedded default's local-embedder) computes the vectors.
        matrix = serving.responder.embed(model, inputs, body.get("dimensions"))
        job.vectors = [row.tobytes() for row in np.asarray(matrix, dtype="<f4")]
    return job


def _inputs(raw: object, max_inputs: int) -> list[str]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise Reject(400, "'input' must be a string or a non-empty array of strings",
                     "invalid_value", "input")
    if not all(isinstance(item, str) for item in raw):
        if all(isinstance(item, (int, list)) for item in raw):
            raise Reject(400, "token-id arrays are not supported by this server; send strings",
                         "invalid_value", "input")
        raise Reject(400, "'input' must be a string or an array of strings", "invalid_value",
                     "input")
    if len(raw) > max_inputs:
        raise Reject(400, f"too many inputs: {len(raw)}, at most {max_inputs} per request",
                     "invalid_value", "input")
    for index, text in enumerate(raw):
        if not text:
            raise Reject(400, f"input[{index}] is empty; inputs must be non-empty strings",
                         "invalid_value", "input")
    return raw
