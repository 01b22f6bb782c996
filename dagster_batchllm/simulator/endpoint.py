"""`SimulatedEndpoint`: start, stop and steer a simulated OpenAI-compatible server."""

from __future__ import annotations

import tempfile

from ..openai_server.endpoint import ServedEndpoint
from ..openai_server.responder import Responder
from .server import SimApp
from .state import BATCH_STAGES, DEFAULT_CONFIG, SimState, normalize_outcome


class SimulatedEndpoint(ServedEndpoint):
    """A real HTTP server on 127.0.0.1 speaking the OpenAI protocol, with fault injection: the
    server of `dagster_batchllm.openai_server.ServedEndpoint`, with latency, rate limits, faults
    and the batch APIs.

    ``process=False`` runs it on a daemon thread with its own event loop; ``process=True``
    runs ``python -m dagster_batchllm.simulator`` so it does not share the client's GIL.
    Faults, settings and stats go through the ``/_sim/`` admin routes in both modes, and
    survive `restart` (so do the duplicate counts).

    Example::

        import openai
        from dagster_batchllm.testing import SimulatedEndpoint

        with SimulatedEndpoint(latency_s=0.01) as sim:
            client = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
            messages = [{"role": "user", "content": "hello"}]
            sim.script(429)  # the next request gets a 429, then normal answers
            try:
                client.chat.completions.create(model="sim-model", messages=messages)
            except openai.RateLimitError:
                pass
            reply = client.chat.completions.create(model="sim-model", messages=messages)
            assert reply.choices[0].message.content == "[sim] hello"
            assert sim.stats()["by_status"] == {"429": 1, "200": 1}

    Besides chat and completions it serves ``/v1/embeddings`` for ``embedding_models``
    (see `dagster_batchllm.openai_server.embeddings`; the fault script, random fault rates,
    rate-limit windows, auth and ``max_concurrency`` cover it too, its latency is
    ``embedding_latency_s`` or else ``latency_s``), image parts in chat messages (see
    `dagster_batchllm.openai_server.images`) and the Files and Batches API (see
    `dagster_batchllm.simulator.batch_runner`; its calls and its lines have scripts of
    their own): ``batch_stage_s`` is how long a batch stays in each stage, None to hold it
    there until `advance_batches`. Anthropic's Message Batches (``/v1/messages/batches``, for
    ``anthropic.Anthropic(base_url=<base_url without /v1>)``; see
    `dagster_batchllm.simulator.anthropic_batches`) run through the same lifecycle, scripts
    and controls. ``prefix_cache_tokens`` gives it vLLM's prefix cache of that many tokens
    (see `dagster_batchllm.simulator.prefix_cache`; 0, the default, has none): replies report
    ``usage.prompt_tokens_details.cached_tokens`` and ``stats()["prefix_cache"]`` the totals;
    ``prefill_s_per_token`` adds latency per prompt token not cached. Files live in a temp
    dir of this endpoint's, removed when it is garbage-collected or the interpreter exits.
    """

    APP = SimApp
    MAIN_MODULE = "dagster_batchllm.simulator"
    API_KEY_ENV = "DAGSTER_BATCHLLM_SIM_API_KEY"  # the key travels by env, never on a command line
    _state: SimState

    def __init__(
        self,
        models: tuple[str, ...] | list[str] | None = ("sim-model",),
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        max_concurrency: int = 256,
        max_context_tokens: int | None = None,
        api_key: str | None = None,
        responder: Responder | str | None = None,
        process: bool = False,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        rate_limit_window_s: float = 60.0,
        seed: int = 0,
        embedding_models: tuple[str, ...] | list[str] | None = None,
        embedding_dimensions: int = 384,
        max_inputs_per_request: int = 2048,
        embedding_base64: bool = True,
        max_image_bytes: int | None = 20 * 1024 * 1024,
        batch_stage_s: float | None = 0.0,
        prefix_cache_tokens: int = 0,
        prefill_s_per_token: float = 0.0,
    ):
        super().__init__(
            responder, models, host=host, port=port, max_concurrency=max_concurrency,
            api_key=api_key, process=process, embedding_models=embedding_models,
            state=SimState({
                "latency_s": latency_s, "max_context_tokens": max_context_tokens, "seed": seed,
                "requests_per_minute": requests_per_minute,
                "tokens_per_minute": tokens_per_minute,
                "rate_limit_window_s": rate_limit_window_s,
                "embedding_dimensions": embedding_dimensions,
                "max_inputs_per_request": max_inputs_per_request,
                "embedding_base64": embedding_base64, "max_image_bytes": max_image_bytes,
                "prefix_cache_tokens": prefix_cache_tokens,
                "prefill_s_per_token": prefill_s_per_token,
                **dict.fromkeys(BATCH_STAGES, batch_stage_s),
            }))
        self._files_dir: tempfile.TemporaryDirectory | None = None

    def start(self) -> SimulatedEndpoint:
        with self._lock:
            if not self.running and self._state.store.directory is None:
                # kept across restarts, with the batches
                self._files_dir = tempfile.TemporaryDirectory(prefix="batchllm-sim-files-")
                self._state.store.directory = self._files_dir.name
            super().start()
        return self

    # -- control ---------------------------------------------------------------------

    def script(self, *outcomes: int | str) -> None:
        """The next len(outcomes) valid model requests (chat, completions, embeddings) get
        these outcomes in order.

        Outcomes: 200/"ok"; an HTTP error status (429 carries Retry-After: retry_after_s);
        "drop" (close the connection, no response); "malformed" (200, body cut mid-JSON);
        "no_choices" (200, JSON without choices); "empty" (200, content ""); "bad_structured"
        (200, content that is not JSON); "stall" (200 headers and half the body, then
        nothing until the client gives up; it holds its slot meanwhile); "drop_mid_body"
        (200 headers and half the body, then the connection closed). Every outcome
        first holds a slot for latency_s. Requests rejected before that (auth, unknown
        model, context length, server-side rate limit) do not consume the script.
        """
        self._control("script", {"outcomes": [normalize_outcome(o) for o in outcomes]})

    def script_batch_api(self, *outcomes: int | str) -> None:
        """The next Files/Batches API calls get these outcomes: an HTTP error status (and no
        effect), "ok", or "drop" (the call takes effect, then the connection closes unanswered:
        e.g. a batch the client never hears was created)."""
        self._control("script", {"outcomes": [normalize_outcome(o, "batch_api") for o in outcomes],
                                 "target": "batch_api"})

    def script_batch_lines(self, *outcomes: int | str) -> None:
        """The next batch lines answered (over all batches, in order) get these outcomes: an
        HTTP error status (the line goes to the error file) or 200/"ok". After the script,
        ``batch_line_error_rate`` of lines get ``batch_line_error_status``."""
        self._control("script", {"outcomes": [normalize_outcome(o, "batch_lines")
                                              for o in outcomes], "target": "batch_lines"})

    # -- batches ---------------------------------------------------------------------

    def batches(self) -> list[dict]:
        """Every batch as ``client.batches.retrieve`` returns it, newest first, plus
        ``lines_read`` (input lines answered or expired so far)."""
        return self._control("batches", {})["data"]

    def files(self) -> list[dict]:
        """Every file, uploaded or written by a batch, newest first."""
        return self._control("files", {})["data"]

    def advance_batches(self, batch_id: str | None = None, lines: int | None = None
                        ) -> list[dict]:
        """Move each unfinished batch (or just ``batch_id``) on by one stage, or answer
        ``lines`` more of its lines if in progress, then do what became due; the batches after.

        With ``batch_stage_s=None`` this is the only way batches move, so a test controls
        every step; with the default 0 one call runs a batch to its end.
        """
        return self._control("advance_batches", {"batch_id": batch_id, "lines": lines})["data"]

    def complete_batches(self, batch_id: str | None = None) -> list[dict]:
        """Advance stage by stage until each unfinished batch (or ``batch_id``) is done."""
        return self._control("advance_batches",
                             {"batch_id": batch_id, "until_done": True})["data"]

    def expire_batches(self, batch_id: str | None = None) -> list[dict]:
        """Expire each unfinished batch (or ``batch_id``) now: its output keeps the lines
        answered so far, its error file lists the others as ``batch_expired``."""
        return self._control("expire_batches", {"batch_id": batch_id})["data"]

    def configure(self, **settings) -> None:
        """Change any `DEFAULT_CONFIG` setting while running: latency_s, fault rates,
        retry_after_s, seed, rate limits, embedding and image limits, the batch_*_s stage
        times, batch_line_error_rate / _status, batch_expire_after_fraction, echo_credentials
        and huge_reply_bytes / huge_reply_declared (a careless server: see
        `dagster_batchllm.simulator.misbehaving`), ..."""
        unknown = set(settings) - set(DEFAULT_CONFIG)
        if unknown:
            raise ValueError(f"unknown setting(s) {sorted(unknown)}; "
                             f"known: {sorted(DEFAULT_CONFIG)}")
        self._control("configure", settings)

    def stats(self, log: bool = True) -> dict:
        """Counters since start or reset_stats(), kept across restart().

        requests, ok (valid 200 answers), by_status {"429": n, ...}, dropped, stalled,
        max_concurrent, in_flight, prompt_tokens and completion_tokens (usage of 200 answers
        that carry usage), duplicates (ok answers to a request, by canonical JSON body,
        that an earlier ok answer already served), script_pending, and log: one
        [t_monotonic, status_or_outcome, prompt_tokens, completion_tokens] row per request
        at arrival. ``log=False`` leaves the logs out, which is cheaper on long runs.

        Apart from those (chat and completions only): ``embeddings`` (requests, ok, inputs,
        prompt_tokens, by_status, dropped, stalled, duplicates, log rows of [t, status,
        prompt_tokens, inputs]); ``images`` (requests with images, images, bytes, remote,
        rejected, and a log of {status, prompt, sha256: [...], bytes, remote} per request);
        ``batches`` (files_uploaded, bytes_uploaded, batches_created, lines_answered,
        lines_ok, lines_failed, lines_expired, line_duplicates, api_requests, ...);
        ``prefix_cache`` (requests looked up, their prompt_tokens, the cached_tokens found,
        blocks held, capacity_tokens; all zero without one).
        """
        return self._control("stats", {"log": log})

    def max_in_window(self, window_s: float, what: str = "requests") -> float:
        """Peak requests (or tokens of 200 answers) arriving within any window_s window."""
        if what not in ("requests", "tokens"):
            raise ValueError("what must be 'requests' or 'tokens'")
        return self._control("max_in_window", {"window_s": window_s, "what": what})["value"]
