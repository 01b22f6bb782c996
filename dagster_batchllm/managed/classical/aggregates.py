"""Aggregate requests (``ai_summarize_agg``, ``ai_agg``, ``llm.aggregate``) on the embedded
default: what a classical model can answer about a group of rows, and a refusal otherwise.

An aggregate request carries its instruction in the system message and the group's rows (or,
at a higher level, partial answers) one JSON string a line
(:mod:`dagster_batchllm.ai_functions.aggregate_prompts`). A summary instruction
(``ai_summarize_agg``'s) gets an extractive summary of the items together, so partial
summaries are summarized again at the next level; a sentiment instruction the overall
sentiment. Any other instruction asks for an answer no classical method gives ("What do they
complain about most?"): :class:`~.errors.UnsupportedTask`, the group's ``unsupported_task``
error saying a real model endpoint is needed.
"""

from __future__ import annotations

from dagster_batchllm.ai_functions.aggregate_prompts import read_request
from dagster_batchllm.managed.classical.classifier import TextContext
from dagster_batchllm.managed.classical.errors import UnsupportedTask
from dagster_batchllm.managed.classical.summarizer import DEFAULT_WORDS
from dagster_batchllm.managed.classical.tasks import message_text, task_of, word_limit

REFUSAL = ("answer an open instruction over a group of rows (ai_agg, llm.aggregate): a real "
           "model endpoint is needed; a summary (ai_summarize_agg) or the overall sentiment "
           "is answered here")


def aggregate_answer(messages: list[dict]) -> str | None:
    """The answer to an aggregate request, None for any other request; raises
    UnsupportedTask for an instruction no classical method answers."""
    request = read_request(messages)
    if request is None:
        return None
    _kind, items = request
    system = "\n".join(message_text(m.get("content")) for m in messages
                       if m.get("role") in ("system", "developer"))
    instruction = system.split("\n\n")[0]  # the user's; the rest says what the items are
    task = task_of(instruction)
    context = TextContext("\n".join(items))
    if task == "summarize":
        return context.summary(word_limit(instruction) or DEFAULT_WORDS)
    if task == "sentiment":
        return context.sentiment()
    raise UnsupportedTask(REFUSAL)
