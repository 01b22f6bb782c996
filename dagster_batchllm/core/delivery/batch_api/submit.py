"""Submitting one batch file to its provider, on a thread of its own, and naming its rows.

All of a submission is one thread call (:func:`submit_file`): a stop that cancels the task
waiting for it cannot leave the book saying "submitting" for a batch that was in fact created.
"""

from __future__ import annotations

from typing import Any

from ...settings import EndpointSpec
from .book import SUBMIT_FAILED, BatchBook
from .protocol import BatchProtocol
from .spool import NOT_YET_SUBMITTED, Spool
from .tables import owner_id


def submit_file(book: BatchBook, protocol: BatchProtocol, spool: Spool, endpoint: EndpointSpec,
                *, route: str, scope: str, partition_key: str, log: Any) -> str | None:
    """Upload ``spool``'s file and create its batch: the provider's batch id, or None when it
    refused (its lines then failed in the book, retryably where the error says so)."""
    sub = spool.submission_id
    book.update_batch(sub, lines=spool.written, bytes=spool.written_bytes,
                           owner=owner_id())
    try:
        batch_id, file_id = protocol.submit(
            spool.path, route=route, submission_id=sub,
            metadata={"scope": scope[:500], "partition": partition_key[:500]})
    except Exception as exc:
        error = protocol.api_error(exc)
        try:  # the create may have happened, its reply lost
            batch_id, file_id = protocol.find(sub), None
        except Exception:
            batch_id = None
        if batch_id is None:
            log.warning(f"batchllm: submitting batch file {sub} ({spool.written} lines) "
                             f"to '{endpoint.name}' failed: {error.as_cell()}")
            book.update_batch(sub, status=SUBMIT_FAILED, errors=error.as_cell())
            book.fail_lines(sub, error.message, error.error_type.value,
                                 error.retryable)
            return None
    finally:
        spool.path.unlink(missing_ok=True)
    book.update_batch(sub, batch_id=batch_id, input_file_id=file_id,
                           status="validating")
    log.info(f"batchllm: submitted batch {batch_id} to '{endpoint.name}': "
                  f"{spool.written} lines, {spool.written_bytes / 1e6:.1f} MB (model "
                  f"{spool.model})")
    return batch_id


def batch_name(submitted: dict[str, str | None], cell: str | None) -> str | None:
    """A deferred row's error cell with its file's submission id replaced by the batch id."""
    if cell is None or NOT_YET_SUBMITTED not in cell:
        return cell
    start = cell.index(NOT_YET_SUBMITTED) + len(NOT_YET_SUBMITTED)
    sub = cell[start:cell.index(")", start)]
    batch_id = submitted.get(sub)
    if batch_id is None:
        return cell
    return (cell[:cell.index(NOT_YET_SUBMITTED)] + f"waiting for batch {batch_id}"
            + cell[cell.index(")", start) + 1:])


__all__ = ["batch_name", "submit_file"]
