"""The Files and Batches API routes: what ``client.files`` and ``client.batches`` call.

``POST /v1/files`` streams a multipart upload to disk; ``GET /v1/files/{id}/content``
streams it back. ``POST /v1/batches`` creates a batch over an uploaded ``purpose="batch"``
file; `BatchRunner` moves it through its lifecycle. Every call needs the API key, like the
model routes, and takes its outcome from the ``batch_api`` script (see :mod:`.batch_routes`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable

from aiohttp import web

from ..openai_server.protocol import Reject
from .batch_routes import BatchRoutes, Handler
from .batch_runner import CANCELLABLE, ENDPOINTS, BatchRunner
from .batch_store import public
from .state import SimState

FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
_CHUNK = 1 << 20


class BatchApi(BatchRoutes):
    def __init__(self, state: SimState, authorized: Callable[[web.Request], bool],
                 runner: BatchRunner):
        super().__init__(state, runner)
        self._authorized = authorized

    def routes(self) -> Iterable[tuple[str, str, Handler]]:
        return (
            ("POST", "/v1/files", self.upload),
            ("GET", "/v1/files", self.list_files),
            ("GET", "/v1/files/{file_id}", self.retrieve_file),
            ("DELETE", "/v1/files/{file_id}", self.delete_file),
            ("GET", "/v1/files/{file_id}/content", self.file_content),
            ("POST", "/v1/batches", self.create_batch),
            ("GET", "/v1/batches", self.list_batches),
            ("GET", "/v1/batches/{batch_id}", self.retrieve_batch),
            ("POST", "/v1/batches/{batch_id}/cancel", self.cancel_batch),
        )

    def authorized(self, request: web.Request) -> bool:
        return self._authorized(request)

    def unauthorized(self) -> Reject:
        return Reject(401, "Incorrect API key provided.", "invalid_api_key")

    # -- files -----------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise Reject(400, "expected multipart/form-data with 'file' and 'purpose'")
        partial = self.store.path(f"upload-{uuid.uuid4().hex}.part")
        purpose = filename = None
        try:
            async for part in await request.multipart():
                if part.name == "purpose":
                    purpose = (await part.text()).strip()
                elif part.name == "file":
                    filename = part.filename or "upload.jsonl"
                    with open(partial, "wb") as out:
                        while chunk := await part.read_chunk(_CHUNK):
                            out.write(chunk)
                else:  # e.g. expires_after[...]: read and ignored
                    await part.release()
            if filename is None:
                raise Reject(400, "Missing required parameter: 'file'.", param="file")
            if purpose not in FILE_PURPOSES:
                raise Reject(400, f"Invalid purpose {purpose!r}; one of {FILE_PURPOSES}",
                             param="purpose")
            record = self.store.add_file(partial, filename, purpose)
        finally:
            partial.unlink(missing_ok=True)  # gone already when the upload was kept
        self.store.files_uploaded += 1
        self.store.bytes_uploaded += record["bytes"]
        return web.json_response(public(record))

    async def list_files(self, request: web.Request) -> web.Response:
        records = self.store.list_files(request.query.get("purpose"))
        if request.query.get("order") == "asc":
            records.reverse()
        return web.json_response(_page(records, request, default_limit=10000))

    async def retrieve_file(self, request: web.Request) -> web.Response:
        return web.json_response(public(self._file(request)))

    async def delete_file(self, request: web.Request) -> web.Response:
        record = self._file(request)
        reader = self.store.running_input(record["id"])
        if reader is not None:
            raise Reject(409, f"File {record['id']} is the input of batch {reader}, which is "
                              "still running.")
        self.store.delete_file(record["id"])
        return web.json_response({"id": record["id"], "object": "file", "deleted": True})

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        record = self._file(request)
        return web.FileResponse(record["_path"], chunk_size=_CHUNK,
                                headers={"Content-Type": "application/octet-stream"})

    def _file(self, request: web.Request) -> dict:
        file_id = request.match_info["file_id"]
        return _found(self.store.files, file_id, f"No such File object: {file_id}", "id")

    # -- batches ---------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            raise Reject(400, "request body is not valid JSON") from exc
        if not isinstance(body, dict):
            raise Reject(400, "request body must be a JSON object")
        file_id = body.get("input_file_id")
        source = self.store.files.get(file_id) if isinstance(file_id, str) else None
        if source is None:
            raise Reject(400, f"Invalid 'input_file_id': no such file {file_id!r}.",
                         "invalid_value", "input_file_id")
        if source["purpose"] != "batch":
            raise Reject(400, f"File {file_id} has purpose {source['purpose']!r}; a batch "
                              "input needs purpose 'batch'.", "invalid_value", "input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise Reject(400, f"Invalid 'endpoint' {endpoint!r}; supported: {ENDPOINTS}",
                         "invalid_value", "endpoint")
        if body.get("completion_window") != "24h":
            raise Reject(400, "Invalid 'completion_window': only '24h' is supported.",
                         "invalid_value", "completion_window")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and all(
                isinstance(v, str) for v in metadata.values())):
            raise Reject(400, "'metadata' must map strings to strings", "invalid_value",
                         "metadata")
        record = self.store.add_batch(file_id, endpoint, metadata)
        return web.json_response(public(record))

    async def list_batches(self, request: web.Request) -> web.Response:
        records = [public(r) for r in reversed(self.store.batches.values())]
        return web.json_response(_page(records, request, default_limit=20))

    async def retrieve_batch(self, request: web.Request) -> web.Response:
        return web.json_response(public(self._batch(request)))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        record = self._batch(request)
        self.store.cancel_requests += 1
        if record["status"] in CANCELLABLE:
            self.runner.cancel(record)
        elif record["status"] != "cancelling":
            raise Reject(409, f"Cannot cancel a batch with status '{record['status']}'.")
        return web.json_response(public(record))

    def _batch(self, request: web.Request) -> dict:
        batch_id = request.match_info["batch_id"]
        return _found(self.store.batches, batch_id, f"No batch found with id '{batch_id}'.",
                      "batch_id")


def _found(records: dict, key: str, missing: str, param: str) -> dict:
    """The record under ``key``, or the 404 OpenAI answers for it (``missing``, ``param``)."""
    record = records.get(key)
    if record is None:
        raise Reject(404, missing, "not_found", param)
    return record


def _page(records: list[dict], request: web.Request, default_limit: int) -> dict:
    """One cursor page: ``after`` is the id of the last object of the previous page."""
    after = request.query.get("after")
    if after:
        ids = [r["id"] for r in records]
        records = records[ids.index(after) + 1:] if after in ids else []
    try:
        limit = int(request.query.get("limit", default_limit))
    except ValueError as exc:
        raise Reject(400, "'limit' must be an integer", param="limit") from exc
    page = records[:max(limit, 1)]
    return {"object": "list", "data": page, "has_more": len(records) > len(page),
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None}
