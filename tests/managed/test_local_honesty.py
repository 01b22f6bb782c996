"""The embedded default is honest: what it cannot do is refused, what it does is classical.

Requests are the ones the AI functions really send: through DuckDB's ``ai_*`` functions and
the client, to the embedded endpoint (the classical models behind the package's OpenAI-protocol
server, dagster_batchllm.openai_server).
"""

from __future__ import annotations

import json

import duckdb
import pytest

from dagster_batchllm.managed.classical import (
    ClassicalResponder,
    UnsupportedTask,
    patterns,
    start_local_endpoint,
)
from dagster_batchllm.sql import register_ai_functions

REAL_ENDPOINT = "point the resource at a real model endpoint (Endpoint(base_url=...))"
CALL = (
    "Agent: Thank you for calling Northwind, this is Maria. How can I help?\n"
    "Customer: Hi, I ordered a blender on 10/28, order #A-104233, and it arrived cracked.\n"
    "Agent: Can I get your phone number and email?\n"
    "Customer: It's (555) 013-2291, and jo.miller7@example.com. I am really angry.\n"
    "Customer: I want a full refund of $49.99, not a store credit.\n"
    "Agent: I've processed the refund, it should show in 5-7 business days."
)


@pytest.fixture(scope="module")
def embedded():
    endpoint = start_local_endpoint(process=False)
    yield endpoint
    endpoint.stop()


@pytest.fixture
def con(make_client, embedded):
    connection = duckdb.connect()
    register_ai_functions(connection, make_client(embedded), default_model="local")
    connection.execute("CREATE TABLE calls AS SELECT ? AS t", [CALL])
    embedded.reset_stats()
    yield connection
    connection.close()


def _one(con, sql: str):
    return con.execute(sql).fetchone()[0]


def _ask(prompt: str, model: str = "local", system: str | None = None, **params) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    return ClassicalResponder().respond(model, messages, params)


# -- refused: a per-row error that names what is needed, sent once ---------------------------

@pytest.mark.parametrize("sql, what", [
    ("SELECT ai_translate('good morning', 'French')", "cannot translate text"),
    ("SELECT ai_fix_grammar('he go to school')", "cannot correct grammar"),
    ("SELECT ai_gen('Write a haiku about queues')", "cannot generate free text"),
    ("SELECT ai_gen('What is the capital of France?')", "cannot answer open questions"),
    ("SELECT ai_gen('hello')", "cannot answer a prompt that names no task"),
    ("SELECT ai_mask('I live in Paris', ['city'])", "cannot find ['city'] by pattern"),
])
def test_what_it_cannot_do_fails_the_row_and_names_a_real_endpoint(con, embedded, sql, what):
    with pytest.raises(duckdb.Error) as raised:
        con.sql(sql).fetchall()
    message = str(raised.value)
    assert what in message and "real model endpoint" in message, message
    statuses = embedded.stats(log=False)["by_status"]
    assert statuses == {"422": 1}, statuses  # 422 is final: the client sent it once


def test_the_refusal_is_an_openai_error_body(embedded):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=embedded.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        client.chat.completions.create(model="local", messages=[
            {"role": "system", "content": "Translate the text the user sends into French."},
            {"role": "user", "content": "good morning"}])
    assert raised.value.status_code == 422
    assert raised.value.body == {
        "message": "the embedded classical models cannot translate text; " + REAL_ENDPOINT,
        "type": "invalid_request_error", "param": None, "code": "unsupported_task"}


def test_ai_query_with_fail_on_error_false_reports_the_refusal(con, embedded):
    row = _one(con, "SELECT ai_query('local', 'Translate to German: ' || t, "
                    "failOnError => false) FROM calls")
    assert row["result"] is None
    assert "cannot translate text" in row["errorMessage"] and REAL_ENDPOINT in row["errorMessage"]


def test_refusals_carry_the_openai_error_fields():
    with pytest.raises(UnsupportedTask) as raised:
        _ask("Translate to French: hello there")
    refusal = raised.value
    assert (refusal.status_code, refusal.error_type, refusal.code) == (
        422, "invalid_request_error", "unsupported_task")
    assert str(refusal) == ("the embedded classical models cannot translate text; "
                            + REAL_ENDPOINT)


@pytest.mark.parametrize("prompt", [
    "Write a product description for a blender",
    "Please explain how refunds work",
    "Can you draft a reply to this customer: I want my money back",
    "Why is the sky blue?",
    "Describe the customer's issue: " + CALL,
])
def test_open_ended_prompts_are_refused_by_every_chat_model(prompt):
    for model in ("local", "local-summarizer", "local-classifier"):
        with pytest.raises(UnsupportedTask):
            _ask(prompt, model)


def test_named_models_keep_their_task_and_a_task_named_anywhere_is_done():
    """Bare text to local-summarizer is summarized (its name is the task); the alias needs
    the task named, in the prompt or the system message."""
    assert _ask("Hello, my blender broke and I want a refund.", "local-summarizer") \
        == "Hello, my blender broke and I want a refund."
    assert _ask("I love it, works great, thank you!", "local-classifier") == "positive"
    with pytest.raises(UnsupportedTask, match="names no task"):
        _ask("my blender broke and I want a refund")
    assert _ask("my blender broke and I want a refund", system="Summarize the text.") \
        == "my blender broke and I want a refund"
    # "correct" alone is not a grammar request: the label list below is classified.
    assert _ask("Classify into the correct one of: refund, inquiry. Text: refund my order",
                "local-classifier") == "refund"


# -- done classically --------------------------------------------------------------------------

def test_ai_extract_returns_what_a_pattern_finds_and_null_otherwise(con):
    labels = ["person", "email", "phone", "date", "order number", "amount", "product", "city",
              "company"]
    entities = _one(con, f"SELECT ai_extract(t, {labels}) FROM calls")
    assert entities == {
        "person": "Maria", "email": "jo.miller7@example.com", "phone": "(555) 013-2291",
        "date": "10/28", "order number": "A-104233", "amount": "$49.99", "product": "blender",
        "city": None, "company": None,
    }
    assert _one(con, "SELECT ai_extract('John Smith called from Paris', ['person', 'city'])") \
        == {"person": "John Smith", "city": None}
    nothing = _one(con, "SELECT ai_extract('the weather is nice', ['person', 'email', 'date'])")
    assert nothing == {"person": None, "email": None, "date": None}


def test_ai_mask_masks_by_pattern(con):
    text = ("My name is Jane Doe, card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00, "
            "SSN 123-45-6789, mail jane.doe@example.com, phone +1 (555) 013-2291 or 555-1234. "
            "Order 4111 1111 1111 1112 is not a card.")
    masked = _one(con, f"SELECT ai_mask('{text}', ['person', 'credit card', 'iban', 'ssn', "
                       "'email', 'phone'])")
    assert masked == (
        "My name is [MASKED], card [MASKED], IBAN [MASKED], SSN [MASKED], mail [MASKED], "
        "phone [MASKED] or [MASKED]. Order 4111 1111 1111 1112 is not a card.")
    # Only the kinds asked for: a phone-only mask keeps the e-mail.
    assert _one(con, "SELECT ai_mask('call 555-1234 or mail a@b.co', ['phone'])") \
        == "call [MASKED] or mail a@b.co"


def test_luhn_and_card_runs():
    assert patterns.luhn_valid("4111111111111111") and not patterns.luhn_valid("4111111111111112")
    assert patterns.find_all("card", "pay 5500-0000-0000-0004 or 378282246310005") == [
        "5500-0000-0000-0004", "378282246310005"]
    assert patterns.find("card", "tracking 123456789012") is None  # 12 digits: too short


def test_struct_int_fields_get_numbers_from_the_text_never_type_bounds(con):
    fmt = ("STRUCT<score: INT, rating: INT, confidence: INT, priority: INT, word_count: INT, "
           "amount: DOUBLE, order_id: BIGINT, n: TINYINT, summary: STRING, next_step: STRING>")
    angry = _one(con, f"SELECT ai_query('local', 'Analyze: ' || t, responseFormat => '{fmt}') "
                      "FROM calls")
    calm = _one(con, "SELECT ai_query('local', 'Analyze: I love it, thank you so much!', "
                     f"responseFormat => '{fmt}')")
    bounds = {-(2 ** b) for b in (7, 15, 31, 63)} | {2 ** b - 1 for b in (7, 15, 31, 63)}
    for reply in (angry, calm):
        numbers = [v for k, v in reply.items() if k not in ("summary", "next_step")]
        assert not bounds & set(numbers), reply
        assert 0 <= reply["score"] <= 100 and 1 <= reply["rating"] <= 5
        assert 50 <= reply["confidence"] <= 100 and 1 <= reply["priority"] <= 3
        assert reply["next_step"] is None  # free text no classical method writes
    assert angry["score"] < calm["score"] and angry["rating"] < calm["rating"]
    assert angry["priority"] == 3 and calm["priority"] == 1
    assert angry["amount"] == 49.99 and angry["order_id"] == 104233
    assert calm["amount"] is None and calm["order_id"] is None
    assert angry["word_count"] == angry["n"] > 50 and "refund" in angry["summary"]


def test_ai_similarity_is_the_embedding_cosine(con):
    same = _one(con, "SELECT ai_similarity('I want a refund for my blender', "
                     "'please refund the blender I bought')")
    unrelated = _one(con, "SELECT ai_similarity('I want a refund for my blender', "
                          "'what time does the store open on sunday')")
    identical = _one(con, "SELECT ai_similarity('order status please', 'order status please')")
    assert identical == pytest.approx(1.0, abs=1e-4)
    assert 0.0 <= unrelated < same < identical
    assert same > 0.25 and unrelated < 0.15


def test_summaries_classification_and_sentiment_are_unchanged(con):
    summary, label, sentiment = con.execute(
        "SELECT ai_summarize(t, 15), ai_classify(t, ['refund', 'complaint', 'inquiry']), "
        "ai_analyze_sentiment(t) FROM calls").fetchone()
    assert len(summary.split()) <= 15 and "refund" in summary
    assert label == "refund" and sentiment == "negative"


def test_json_schema_fields_named_after_entities(con):
    schema = {"type": "object", "additionalProperties": False,
              "required": ["customer_name", "emails", "callback_phone", "purchase_date", "city"],
              "properties": {"customer_name": {"type": ["string", "null"]},
                             "emails": {"type": "array", "items": {"type": "string"}},
                             "callback_phone": {"type": "string"},
                             "purchase_date": {"type": "string", "format": "date"},
                             "city": {"type": "string"}}}
    reply = json.loads(_ask("Extract fields from: my name is Ann Lee, mail ann@x.io or "
                            "ann.lee@work.example, bought on 2026-10-28",
                            response_format={"type": "json_schema",
                                             "json_schema": {"name": "x", "schema": schema}}))
    assert reply == {"customer_name": "Ann Lee", "emails": ["ann@x.io", "ann.lee@work.example"],
                     "callback_phone": "", "purchase_date": "2026-10-28", "city": ""}


def test_numeric_enums_follow_the_text_rather_than_the_first_option():
    schema = {"type": "object", "required": ["stars", "order_count"],
              "properties": {"stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
                             "order_count": {"type": "integer", "minimum": 0}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    happy = json.loads(_ask("Rate: I love it, wonderful, thank you!", response_format=fmt))
    angry = json.loads(_ask("Rate: terrible, I hate this, I am furious", response_format=fmt))
    assert (happy["stars"], angry["stars"]) == (5, 1)
    assert angry["order_count"] == 7  # a count (here the words), not an order number
