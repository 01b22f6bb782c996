"""The batch lifecycle: validating -> in_progress -> finalizing -> completed, or failed /
expired / cancelling -> cancelled, driven by time and by the controller.

Each stage lasts its ``batch_*_s`` setting (0: move on at once; None: wait for
``advance_batches``). In progress, lines are answered at an even pace over
``batch_in_progress_s`` (all at once when 0), in chunks so the event loop keeps serving.
A line is answered by the same code as the online route (so a batch answer equals the
online answer for the same body), unless the line script or ``batch_line_error_rate`` gives
it an error status. 200s go to the output file, errors to the error file, as
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``.

An expired batch (``expire_batches`` or ``batch_expire_after_fraction``) keeps the lines
answered so far in its output; the lines never answered go to the error file with
``"response": null, "error": {"code": "batch_expired", ...}``, as OpenAI documents. A
cancelled batch keeps its partial output and lists nothing for unanswered lines.
``request_counts`` count answered lines only.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..openai_server.chat import prepare_generation
from ..openai_server.embeddings import prepare_embeddings
from ..openai_server.protocol import Reject, Serving, error_body, responder_failure
from ..openai_server.state import request_key
from .batch_store import TERMINAL, BatchStore
from .misbehaving import line_error_message, padded

TICK_S = 0.02
CHUNK_LINES = 500  # lines per step: the loop serves other requests between steps
MAX_VALIDATION_ERRORS = 100
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CANCELLABLE = ("validating", "in_progress", "finalizing")  # the stages a cancel cuts short
EXPIRED_ERROR = {"code": "batch_expired",
                 "message": "This request could not be executed before the completion window "
                            "expired."}


@dataclass
class _Validation:
    """Progress through an input file (runtime only: a restarted server validates anew)."""

    offset: int = 0
    line_no: int = 0
    total: int = 0
    seen: set = field(default_factory=set)
    errors: list = field(default_factory=list)
    model: str | None = None


class BatchRunner:
    def __init__(self, serving: Serving):
        self.serving, self.state = serving, serving.state
        self._validations: dict[str, _Validation] = {}
        #: The key the server requires (what its line errors quote with echo_credentials).
        self.api_key: str | None = None

    @property
    def store(self) -> BatchStore:
        return self.state.store

    async def drive(self) -> None:
        """The server's background task: do due work, and idle TICK_S when there is none."""
        while True:
            worked = 0 if self.state.killed else self.step(CHUNK_LINES)
            await asyncio.sleep(0 if worked else TICK_S)

    async def command(self, name: str, payload: dict) -> dict:
        """The admin commands that need this server: advance, expire or settle batches."""
        wanted = payload.get("batch_id")
        targets = [r for r in self.store.active() if wanted in (None, r["id"])]
        if wanted is not None and wanted not in self.store.batches:
            raise KeyError(f"no batch {wanted!r}")
        if name == "expire_batches":
            for record in targets:
                record["_sim"]["expire_now"] = True
        elif name == "advance_batches":
            lines, until_done = payload.get("lines"), payload.get("until_done", False)
            for _ in range(8 if until_done else 1):  # at most every stage once
                for record in targets:
                    self._release(record, lines)
                await self.settle()
                targets = [r for r in targets if r["status"] not in TERMINAL]
                if not targets:
                    break
        await self.settle()
        ids = [wanted] if wanted else None
        return {"data": [b for b in self.store.list_batches() if ids is None or b["id"] in ids]}

    async def settle(self) -> None:
        """Do all work that is due now, yielding to the loop between chunks."""
        while self.step(CHUNK_LINES):
            await asyncio.sleep(0)

    def cancel(self, record: dict) -> None:
        """Stop answering lines; cancelled after ``batch_cancelling_s``, with partial output."""
        self._enter(record, "cancelling", time.time())

    def _release(self, record: dict, lines: int | None) -> None:
        sim = record["_sim"]
        if lines is not None and record["status"] == "in_progress":
            sim["line_target"] = max(sim["line_target"] or 0, sim["line"]) + int(lines)
        elif lines is None:
            sim["release"] = record["status"]

    # -- one step ----------------------------------------------------------------------

    def step(self, budget: int) -> int:
        """Up to ``budget`` lines of due work over all unfinished batches; the work done."""
        now, done = time.time(), 0
        for record in self.store.active():
            if done >= budget:
                break
            try:
                done += self._step_batch(record, now, budget - done)
            except Exception as exc:  # an unreadable file or a bug: fail this batch visibly
                self._fail(record, now, [{"code": "internal_error", "line": None,
                                          "param": None,
                                          "message": f"{type(exc).__name__}: {exc}"}])
                done += 1
        return done

    def _step_batch(self, record: dict, now: float, budget: int) -> int:
        status, sim = record["status"], record["_sim"]
        if status == "cancelling":
            if self._due(record, "batch_cancelling_s", now):
                self._finish(record, "cancelled", now)
                return 1
            return 0
        if sim["expire_now"] or (sim["expire_after"] is not None
                                 and sim["line"] >= sim["expire_after"]):
            return self._expire(record, now, budget)
        if status == "validating":
            return self._validate(record, now, budget) if self._due(
                record, "batch_validating_s", now) else 0
        if status == "in_progress":
            total = record["request_counts"]["total"]
            if sim["line"] >= total:
                self._enter(record, "finalizing", now)
                return 1
            target = self._line_target(record, now)
            return self._answer_lines(record, min(budget, target - sim["line"])) if (
                target > sim["line"]) else 0
        if status == "finalizing" and self._due(record, "batch_finalizing_s", now):
            self._finish(record, "completed", now)
            return 1
        return 0

    def _due(self, record: dict, key: str, now: float) -> bool:
        duration, sim = self.state.config[key], record["_sim"]
        return sim["release"] == record["status"] or (
            duration is not None and now - sim["stage_since"] >= float(duration))

    def _line_target(self, record: dict, now: float) -> int:
        sim, total = record["_sim"], record["request_counts"]["total"]
        duration = self.state.config["batch_in_progress_s"]
        if sim["release"] == "in_progress" or duration == 0:
            target = total
        elif duration is None:
            target = 0
        else:
            target = math.ceil(total * min(1.0, (now - sim["stage_since"]) / float(duration)))
        target = max(target, sim["line_target"] or 0)
        if sim["expire_after"] is not None:
            target = min(target, sim["expire_after"])
        return min(target, total)

    # -- stages ------------------------------------------------------------------------

    def _enter(self, record: dict, status: str, now: float) -> None:
        record["status"] = status
        record[f"{status}_at"] = int(now)
        record["_sim"].update(stage_since=now, release=None)

    def _fail(self, record: dict, now: float, errors: list[dict]) -> None:
        self._validations.pop(record["id"], None)
        record["errors"] = {"object": "list", "data": errors}
        self._enter(record, "failed", now)

    def _finish(self, record: dict, status: str, now: float) -> None:
        """Enter a terminal status, publishing the output and error files that have lines."""
        self._validations.pop(record["id"], None)
        for key, field_name, purpose in (("output", "output_file_id", "batch_output"),
                                         ("errors", "error_file_id", "batch_output")):
            path = Path(record["_sim"][key])
            if path.exists() and path.stat().st_size:
                suffix = "output" if key == "output" else "error"
                added = self.store.add_file(path, f"{record['id']}_{suffix}.jsonl", purpose)
                record[field_name] = added["id"]
            else:
                path.unlink(missing_ok=True)
        self._enter(record, status, now)

    def _validate(self, record: dict, now: float, budget: int) -> int:
        progress = self._validations.setdefault(record["id"], _Validation())
        source = self.store.files.get(record["input_file_id"])
        if source is None:
            self._fail(record, now, [_error("missing_file", "The input file was deleted.")])
            return 1
        endpoint, read = record["endpoint"], 0
        with open(source["_path"], "rb") as handle:
            handle.seek(progress.offset)
            while read < budget and len(progress.errors) < MAX_VALIDATION_ERRORS:
                raw = handle.readline()
                if not raw:
                    break
                read += 1
                progress.line_no += 1
                if raw.strip():
                    progress.total += 1
                    problem = _check_line(raw, endpoint, progress)
                    if problem is not None:
                        progress.errors.append({**problem, "line": progress.line_no})
            progress.offset = handle.tell()
            at_end = not handle.read(1)
        if not at_end and len(progress.errors) < MAX_VALIDATION_ERRORS:
            return max(read, 1)
        limit = self.state.config["batch_max_lines"]
        if progress.total == 0:
            progress.errors.append(_error("empty_file", "The batch input file is empty."))
        elif limit and progress.total > limit:
            progress.errors.append(_error(
                "too_many_requests", f"The batch has {progress.total} requests; at most "
                                     f"{limit} are allowed per batch."))
        if progress.errors:
            self._fail(record, now, progress.errors)
            return max(read, 1)
        del self._validations[record["id"]]
        record["request_counts"]["total"] = progress.total
        record["model"] = progress.model
        fraction = self.state.config["batch_expire_after_fraction"]
        if fraction is not None:
            record["_sim"]["expire_after"] = math.ceil(float(fraction) * progress.total)
        self._enter(record, "in_progress", now)
        return max(read, 1)

    def _expire(self, record: dict, now: float, budget: int) -> int:
        """Write the unanswered lines to the error file, a chunk a step, then expire."""
        sim = record["_sim"]
        if record["status"] == "validating":  # nothing was answered, nothing is owed
            self._validations.pop(record["id"], None)
            self._finish(record, "expired", now)
            return 1
        written, lines = 0, []
        with open(self.store.files[record["input_file_id"]]["_path"], "rb") as handle:
            handle.seek(sim["offset"])
            while written < budget:
                raw = handle.readline()
                if not raw:
                    break
                if raw.strip():
                    sim["line"] += 1
                    written += 1
                    lines.append({"id": _line_id(record, sim["line"]),
                                  "custom_id": json.loads(raw)["custom_id"],
                                  "response": None, "error": EXPIRED_ERROR})
            sim["offset"] = handle.tell()
            at_end = not handle.read(1)
        _append(sim["errors"], lines)
        self.store.lines_expired += len(lines)
        if at_end:
            self._finish(record, "expired", now)
        return max(written, 1)

    # -- answering lines ---------------------------------------------------------------

    def _answer_lines(self, record: dict, count: int) -> int:
        sim, counts, usage = record["_sim"], record["request_counts"], record["usage"]
        output, errors, answered = [], [], 0
        with open(self.store.files[record["input_file_id"]]["_path"], "rb") as handle:
            handle.seek(sim["offset"])
            while answered < count:
                raw = handle.readline()
                if not raw:  # validation counted more lines: the file changed under us
                    raise RuntimeError(f"input file ended after {sim['line']} of "
                                       f"{record['request_counts']['total']} lines")
                if not raw.strip():
                    continue
                answered += 1
                sim["line"] += 1
                line = json.loads(raw)
                status, body, tokens = self.answer(record["endpoint"], line["body"])
                serial = _line_id(record, sim["line"])
                result = {"id": serial, "custom_id": line["custom_id"],
                          "response": {"status_code": status,
                                       "request_id": serial.replace("batch_req_", "req_"),
                                       "body": body}, "error": None}
                (output if status == 200 else errors).append(result)
                counts["completed" if status == 200 else "failed"] += 1
                self.store.count_line(status, request_key(line["body"]) if status == 200
                                      else None)
                usage["input_tokens"] += tokens[0]
                usage["output_tokens"] += tokens[1]
                usage["total_tokens"] += tokens[0] + tokens[1]
                self.store.line_prompt_tokens += tokens[0]
                self.store.line_completion_tokens += tokens[1]
            sim["offset"] = handle.tell()
        _append(sim["output"], output)
        _append(sim["errors"], errors)
        return max(answered, 1)

    def _echoed(self, body: dict) -> dict:
        body["error"]["message"] = line_error_message(self.state, body["error"]["message"],
                                                      self.api_key)
        return body

    def answer(self, endpoint: str, body: dict) -> tuple[int, dict, tuple[int, int]]:
        """One line's status, response body and (prompt, completion) tokens."""
        try:
            if endpoint == "/v1/embeddings":
                job = prepare_embeddings(self.serving, body)
            else:
                job = prepare_generation(self.serving, body, endpoint == "/v1/chat/completions")
        except Reject as exc:
            return exc.status, self._echoed(exc.body()), (0, 0)
        except Exception as exc:  # a responder's refusal or a bug fails the line, as online
            failure = responder_failure(exc)
            return failure.status, self._echoed(failure.body()), (0, 0)
        outcome = self.state.next_line_outcome()
        if outcome != "ok":
            return outcome, self._echoed(error_body(outcome, f"simulated {outcome} error")), (0, 0)
        payload, usage = job.render(self.serving)
        if self.state.config["huge_reply_bytes"]:
            payload = padded(payload, self.state.config["huge_reply_bytes"])
        return 200, payload, (usage["prompt_tokens"], usage.get("completion_tokens", 0))


def _check_line(raw: bytes, endpoint: str, progress: _Validation) -> dict | None:
    """The validation error of one input line, or None (recording its custom_id and model)."""
    try:
        line = json.loads(raw)
    except ValueError:
        return _error("invalid_json_line", "This line is not parseable as valid JSON.")
    if not isinstance(line, dict):
        return _error("invalid_json_line", "Each line must be a JSON object.")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _error("missing_required_parameter", "Missing required parameter: 'custom_id'.",
                      "custom_id")
    if custom_id in progress.seen:
        return _error("duplicate_custom_id", "The custom_id for this request is a duplicate of "
                      "another request. The custom_id parameter must be unique for each "
                      "request in a batch.", "custom_id")
    progress.seen.add(custom_id)
    if line.get("method") != "POST":
        return _error("invalid_method", "The method must be 'POST'.", "method")
    if line.get("url") != endpoint:
        return _error("invalid_url", f"The URL provided for this request does not match the "
                      f"batch endpoint {endpoint!r}.", "url")
    body = line.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return _error("missing_required_parameter", "Each line needs a 'body' object with a "
                      "'model'.", "body")
    if progress.model is None:
        progress.model = body["model"]
    elif body["model"] != progress.model:
        return _error("mismatched_model", f"All requests in a batch must use the same model; "
                      f"this line uses {body['model']!r}, others {progress.model!r}.",
                      "body.model")
    return None


def _error(code: str, message: str, param: str | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": None}


def _line_id(record: dict, line: int) -> str:
    return f"batch_req_{record['id'].removeprefix('batch_')}_{line:06d}"


def _append(path: str, lines: list[dict]) -> None:
    if lines:
        with open(path, "ab") as out:
            out.write("".join(json.dumps(line, ensure_ascii=False) + "\n"
                              for line in lines).encode())
