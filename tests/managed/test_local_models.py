"""The embedded classical models (dagster_batchllm.managed.classical) and the example
transcripts dataset."""

from __future__ import annotations

import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest

from dagster_batchllm.managed.classical import (
    LOCAL_MODELS,
    ClassicalResponder,
    UnsupportedTask,
    start_local_endpoint,
)

DATA_DIR = Path(__file__).resolve().parents[2] / "assets" / "data"
SCHEMA = {
    "type": "object",
    "properties": {
        "risk_level": {"type": "string", "enum": ["High", "Medium", "Low"]},
        "action_required": {"type": "string",
                            "enum": ["Refund Request", "Complaint", "General Inquiry"]},
    },
    "required": ["risk_level", "action_required"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "call_triage", "schema": SCHEMA, "strict": True}}
# The agreement floors the brief asks for; the printed figures are the real measure.
MIN_ACTION_AGREEMENT = 0.80
MIN_RISK_AGREEMENT = 0.70


def clean(text: str) -> str:
    """What the Databricks example does before inference: letters and whitespace only."""
    return re.sub(r"[^a-zA-Z\s]", "", text).lower()


def ask(responder, model: str, prompt: str, **params) -> str:
    return responder.respond(model, [{"role": "user", "content": prompt}], params)


@pytest.fixture(scope="module")
def dataset(generator):
    return generator.load()


@pytest.fixture(scope="module")
def responder():
    return ClassicalResponder()


@pytest.fixture(scope="module")
def predictions(dataset, responder):
    """Labels for every non-blank call, from the cleaned text and from its summary."""
    rows = dataset[dataset.transcript_raw_text.notna()
                   & (dataset.transcript_raw_text.str.strip() != "")]
    out = []
    for row in rows.itertuples():
        text = clean(row.transcript_raw_text)
        summary = ask(responder, "local-summarizer", f"Summarize this call transcript: {text}")
        on_text = ask(responder, "local-classifier", f"Classify this call: {text}",
                      response_format=RESPONSE_FORMAT)
        on_summary = ask(responder, "local-classifier", f"Classify this call summary: {summary}",
                         response_format=RESPONSE_FORMAT)
        out.append((row, summary, json.loads(on_text), json.loads(on_summary)))
    return out


# -- the dataset -----------------------------------------------------------------------------


def test_dataset_shape(dataset):
    assert len(dataset) >= 600
    assert list(dataset.columns) == [
        "call_id", "call_timestamp", "agent", "customer_id", "transcript_raw_text",
        "expected_risk_level", "expected_action_required"]
    assert dataset.call_id.is_unique and dataset.call_id.str.fullmatch(r"CALL-\d{6}").all()
    stamps = dataset.call_timestamp.str.slice(0, 10)
    assert stamps.nunique() >= 10 and stamps.min() == "2026-11-01" and stamps.max() == "2026-11-10"
    hours = dataset.call_timestamp.str.slice(11, 13).astype(int)
    assert hours.between(8, 17).all()
    assert dataset.agent.nunique() == 12

    text = dataset.transcript_raw_text
    blank = text.notna() & (text.str.strip() == "")
    assert text.isna().sum() >= 3 and blank.sum() >= 3  # ~1% each
    assert text.str.len().between(3000, 8000).sum() >= 7  # ~2% long rambling calls
    labelled = text.notna() & ~blank
    assert dataset.loc[labelled, "expected_risk_level"].isin(["High", "Medium", "Low"]).all()
    assert dataset.loc[~labelled, "expected_action_required"].isna().all()
    assert set(dataset.expected_action_required.dropna()) == {
        "Refund Request", "Complaint", "General Inquiry"}
    # Messy, varied text: digits, money, mixed case; not one template.
    assert text.str.contains(r"\$\d+\.\d\d", na=False).mean() > 0.1
    assert text.dropna().str.slice(0, 60).nunique() > 100


def test_generator_is_reproducible(generator, tmp_path):
    """The committed file is exactly what the generator writes (gzip mtime pinned)."""
    assert generator.generate(seed=7) == generator.generate(seed=7)
    fresh = generator.write(tmp_path / generator.OUTPUT.name)
    assert fresh.read_bytes() == generator.OUTPUT.read_bytes()
    assert generator.OUTPUT.stat().st_size < 400_000


# -- classifier agreement --------------------------------------------------------------------


def _agreement(predictions, which: int, field: str, expected: str) -> float:
    hits = [p[which][field] == getattr(p[0], expected) for p in predictions]
    return sum(hits) / len(hits)


@pytest.mark.slow
def test_classifier_agreement_on_cleaned_text_and_summary(predictions):
    figures = {
        source: {
            "risk_level": _agreement(predictions, idx, "risk_level", "expected_risk_level"),
            "action_required": _agreement(predictions, idx, "action_required",
                                          "expected_action_required"),
        }
        for source, idx in (("cleaned text", 2), ("summary of cleaned text", 3))
    }
    print(f"\nagreement over {len(predictions)} calls: {json.dumps(figures, indent=1)}")
    for source in figures.values():
        assert source["action_required"] >= MIN_ACTION_AGREEMENT
        assert source["risk_level"] >= MIN_RISK_AGREEMENT


def test_every_reply_validates(predictions):
    validator = jsonschema.Draft202012Validator(SCHEMA)  # built once: validate() rebuilds it
    for _, _, on_text, on_summary in predictions:
        validator.validate(on_text)
        validator.validate(on_summary)


def test_summaries_keep_the_signal_words(predictions):
    """LIKE '%refund%'-style rules still work on the summary when the call used the word."""
    for row, summary, _, _ in predictions:
        assert summary.strip()
        assert len(summary.split()) <= 40
        text = clean(row.transcript_raw_text)
        for word in ("angry", "refund", "complaint"):
            negated = re.search(rf"\b(?:not|dont|no)\s+(?:\w+\s+){{0,2}}{word}", text)
            if word in text and not negated:
                assert word in summary, (word, summary)


# -- summarizer ------------------------------------------------------------------------------

TRANSCRIPT = (
    "Agent: Thank you for calling Northwind, this is Maria. How can I help?\n"
    "Customer: Hi, I ordered a blender on 10/28, order #A-104233, and it arrived cracked.\n"
    "Agent: I'm sorry to hear that. Can I get your phone number?\n"
    "Customer: It's (555) 013-2291. Honestly I am really angry, this is the second time.\n"
    "Customer: I want a full refund of $49.99, not a store credit.\n"
    "Agent: I've processed the refund, it should show in 5-7 business days.\n"
    "Customer: Fine. Thanks."
)


@pytest.mark.parametrize("instruction, limit", [
    ("Summarize this call transcript in at most 12 words", 12),
    ("Summarize in max 5 words", 5),
    ("Give a summary of no more than 25 words of the following", 25),
    ("Please write a short summary of the call below in at most 8 words, focusing on intent", 8),
    ("Summarize this call transcript", 40),
])
@pytest.mark.parametrize("cleaned", [False, True])
def test_summarizer_word_limits(responder, instruction, limit, cleaned):
    text = clean(TRANSCRIPT) if cleaned else TRANSCRIPT
    summary = ask(responder, "local-summarizer", f"{instruction}: {text}")
    assert summary.strip() and len(summary.split()) <= limit
    if limit >= 12:
        assert "refund" in summary.lower() and "angry" in summary.lower()


def test_summarizer_strips_the_instruction_and_handles_edge_inputs(responder):
    summary = ask(responder, "local-summarizer", "Summarize this call transcript: " + TRANSCRIPT)
    assert "Summarize" not in summary and "Agent:" not in summary
    # Empty input -> "" (documented: nothing to summarize); any word -> non-empty.
    assert ask(responder, "local-summarizer", "Summarize this call transcript: ") == ""
    assert ask(responder, "local-summarizer", "") == ""
    assert ask(responder, "local-summarizer", "Summarize: ok") == "ok"
    long_unpunctuated = " ".join(["word"] * 3000 + ["refund"] + ["word"] * 3000)
    summary = ask(responder, "local-summarizer", "Summarize in at most 10 words: "
                  + long_unpunctuated)
    assert "refund" in summary and len(summary.split()) <= 10


# -- classifier: generic schemas and prompts -------------------------------------------------

GENERIC_SCHEMAS = [
    {"type": "object", "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral", "mixed"]},
        "summary": {"type": "string", "maxLength": 80},
        "score": {"type": "number", "minimum": 0, "maximum": 10},
        "word_count": {"type": "integer"},
        "is_refund_request": {"type": "boolean"},
        "topics": {"type": "array", "items": {"type": "string",
                                              "enum": ["billing", "shipping", "technical"]},
                   "minItems": 1, "uniqueItems": True},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    }, "required": ["sentiment", "summary", "score", "word_count", "is_refund_request",
                    "topics", "note"], "additionalProperties": False},
    {"$defs": {"Priority": {"type": "string", "enum": ["urgent", "not urgent"]},
               "Contact": {"type": "object", "properties": {
                   "email": {"type": "string"}, "phone": {"type": ["string", "null"]}},
                   "required": ["email", "phone"], "additionalProperties": False}},
     "type": "object",
     "properties": {"priority": {"$ref": "#/$defs/Priority"},
                    "contact": {"$ref": "#/$defs/Contact"},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    "stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
                    "kind": {"const": "call"}},
     "required": ["priority", "contact", "confidence", "stars", "kind"],
     "additionalProperties": False},
]


@pytest.mark.parametrize("schema", GENERIC_SCHEMAS)
@pytest.mark.parametrize("text", [TRANSCRIPT, clean(TRANSCRIPT), "", "When do you open?"])
def test_structured_output_validates_for_generic_schemas(responder, schema, text):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for model in (*LOCAL_MODELS, "local"):
        reply = json.loads(ask(responder, model, f"Extract fields from: {text}",
                               response_format=fmt))
        jsonschema.validate(reply, schema)


def test_generic_labels_and_text_tasks(responder):
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": GENERIC_SCHEMAS[0]}}
    reply = json.loads(ask(responder, "local-classifier", "Analyze: " + TRANSCRIPT,
                           response_format=fmt))
    assert reply["sentiment"] == "negative" and reply["is_refund_request"] is True
    cls = "local-classifier"
    assert ask(responder, cls, "Classify into one of: urgent, not urgent. Text: the site is "
               "down, this is an emergency") == "urgent"
    assert ask(responder, cls, "Classify into one of: urgent, not urgent. Text: what are your "
               "opening hours?") == "not urgent"
    assert ask(responder, cls, "Classify the ticket into one of [billing, shipping, technical]: "
               "my package never arrived and tracking is stuck") == "shipping"
    assert ask(responder, cls, "I love it, works great, thank you!") == "positive"
    assert ask(responder, cls, "This is the worst product, I hate it.") == "negative"
    assert ask(responder, "local-summarizer", "What is the sentiment of this review: "
               "terrible, broken on arrival") == "negative"
    masked = ask(responder, "local-summarizer", "Mask personal data: my name is Jane Doe, "
                 "mail jane.doe@example.com or call (555) 013-2291")
    assert masked == "Mask personal data: my name is [MASKED], mail [MASKED] or call [MASKED]" \
        or masked == "my name is [MASKED], mail [MASKED] or call [MASKED]"
    # No translation or grammar model here: refused, never echoed (tests/managed/
    # test_local_honesty.py has the rest of what is refused and why).
    with pytest.raises(UnsupportedTask, match="cannot translate text; point the resource"):
        ask(responder, "local", "Translate to French: hello there")
    with pytest.raises(UnsupportedTask, match="cannot correct grammar"):
        ask(responder, "local", "Fix the grammar: me like cats")
    with pytest.raises(ValueError):
        ask(responder, "gpt-4o", "hello")


@pytest.mark.parametrize("prompt", [
    "Classify this call: {text}",
    "Classify the call as Refund Request, Complaint or General Inquiry: {text}",
    "You are a call-center analyst. Read the transcript and return the risk level and the "
    "action required (Refund Request, Complaint or General Inquiry).\nTranscript: {text}",
    "Triage the call below.\n{text}",
])
def test_instructions_do_not_leak_into_the_classified_text(responder, prompt):
    """Label names in the instruction ("Refund Request") must not count as evidence."""
    text = "Agent: Northwind, how can I help?\nCustomer: What time do you open on Saturday?"
    reply = json.loads(ask(responder, "local-classifier", prompt.format(text=text),
                           response_format=RESPONSE_FORMAT))
    assert reply == {"risk_level": "Low", "action_required": "General Inquiry"}


def test_deterministic_and_thread_safe(responder, dataset):
    texts = [t for t in dataset.transcript_raw_text.dropna() if t.strip()][:120]
    jobs = [(m, f"Summarize this call transcript: {t}", p) for t in texts
            for m, p in (("local-summarizer", {}),
                         ("local-classifier", {"response_format": RESPONSE_FORMAT}))]

    def run(job):
        model, prompt, params = job
        return ask(responder, model, prompt, **params)

    serial = [run(j) for j in jobs]
    assert serial == [run(j) for j in jobs]
    assert serial == [ask(ClassicalResponder(), m, p, **kw) for m, p, kw in jobs[:10]] + serial[10:]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(run, jobs)) == serial


def test_latency_per_typical_prompt(responder, dataset):
    texts = [clean(t) for t in dataset.transcript_raw_text.dropna() if 60 < len(t.split()) < 160]
    timings = []
    for text in texts[:200]:
        start = time.perf_counter()
        ask(responder, "local-classifier", f"Classify: {text}", response_format=RESPONSE_FORMAT)
        ask(responder, "local-summarizer", f"Summarize this call transcript: {text}")
        timings.append((time.perf_counter() - start) / 2)
    median_ms = statistics.median(timings) * 1000
    print(f"\nmedian latency per ~100-word prompt: {median_ms:.2f} ms")
    assert median_ms < 10  # ~0.5 ms here; loose so a loaded CI box does not flake


# -- over HTTP -------------------------------------------------------------------------------


def test_local_endpoint_with_the_openai_client():
    openai = pytest.importorskip("openai")
    endpoint = start_local_endpoint(process=False)
    try:
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused", max_retries=0)
        assert {m.id for m in client.models.list()} >= set(LOCAL_MODELS)
        summary = client.chat.completions.create(
            model="local-summarizer", max_tokens=200,
            messages=[{"role": "user", "content": f"Summarize this call transcript in at most "
                                                  f"20 words: {TRANSCRIPT}"}],
        ).choices[0].message.content
        assert 0 < len(summary.split()) <= 20 and "refund" in summary
        reply = client.chat.completions.create(
            model="local-classifier", response_format=RESPONSE_FORMAT,
            messages=[{"role": "system", "content": "You triage call center transcripts."},
                      {"role": "user", "content": f"Classify this call: {TRANSCRIPT}"}],
        )
        labels = json.loads(reply.choices[0].message.content)
        jsonschema.validate(labels, SCHEMA)
        assert labels == {"risk_level": "High", "action_required": "Refund Request"}
        assert reply.usage.completion_tokens > 0
    finally:
        endpoint.stop()
