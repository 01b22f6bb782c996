"""The answers journal: what one call appends reads back whole, in order, however many."""

from __future__ import annotations

from dagster_batchllm.core.ledger import journal as journal_module
from dagster_batchllm.core.ledger.journal import AnswerJournal, read_records


def _record(i: int, **extra) -> dict:
    return {"request_key": f"k{i:05d}", "status": "ok", "response": f"answer {i}", **extra}


def test_a_large_append_is_written_in_pieces_and_reads_back_whole(tmp_path):
    journal = AnswerJournal(tmp_path)
    count = 3 * journal_module._LINES_PER_WRITE + 7  # several writes in one call
    records = [_record(i) for i in range(count)]
    records[300] = _record(300, error=None)  # other fields: an object line mid-way
    journal.append_many(records)
    journal.append_many([_record(count)])  # a later call continues the array lines
    lines = journal.path.read_bytes().splitlines()
    assert len(lines) == count + 1
    assert sum(line.startswith(b"{") for line in lines) == 3  # the first, #300, #301
    assert read_records(journal.path) == [*records, _record(count)]
    journal.close(remove=True)
    assert not journal.path.exists()


def test_json_safe_text_goes_in_as_it_is_and_other_text_is_escaped(tmp_path):
    from dagster_batchllm.core.ledger.journal import JsonSafeText

    journal = AnswerJournal(tmp_path)
    vector_text = JsonSafeText("AACAPwAAAEA=")  # base64: nothing to escape
    records = [_record(0), _record(1, response=vector_text) | {"response": vector_text},
               _record(2) | {"response": 'a "quoted"\nline\\'}]
    journal.append_many(records)
    raw = journal.path.read_text()
    assert '"AACAPwAAAEA="' in raw and '\\"quoted\\"\\nline\\\\' in raw
    assert read_records(journal.path) == records
    journal.close(remove=True)
