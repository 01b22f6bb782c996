"""Reading a chat request: instruction vs. input text, word limits, label lists, task kind.

Prompts arrive as ``"<instruction>: <text>"`` (the Databricks ``ai_query`` idiom), as an
instruction line followed by the text, or with the instruction in a system message.  These
helpers take them apart without any model: regexes over the instruction only, never over the
input text (a transcript may well contain "max 5 words" or a colon).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dagster_batchllm.managed.classical.lexicon import word_list

_MAX_INSTRUCTION_WORDS = 12  # any prefix this short that has an instruction word
_MAX_IMPERATIVE_WORDS = 40  # a longer one must start like a command ("Please summarize ...")
_INSTRUCTION_WORDS = frozenset(word_list(
    """summarize summarise summary summarization classify classification categorize categorise
    label extract analyze analyse translate fix correct mask redact anonymize anonymise detect
    identify determine rate give provide write return tell describe what which following
    sentiment text transcript review message document input answer respond"""
))
_SPEAKER_PREFIX = re.compile(
    r"^\s*(?:agent|customer|caller|cust|rep|representative|client|operator|user|assistant)\s*$",
    re.I,
)
_WORD_LIMITS = (
    re.compile(r"(?:at most|max(?:imum)?(?: of)?|no more than|up to|under|fewer than|less than|"
               r"within|not exceeding|limit(?:ed)? to|in)\s+(\d{1,4})\s+words?", re.I),
    re.compile(r"(\d{1,4})\s+words?\s+(?:or less|or fewer|max(?:imum)?|at most|limit)", re.I),
    re.compile(r"(\d{1,4})[- ]word\s+summary", re.I),
)
_LABEL_LIST = re.compile(
    r"(?:one of|among|labels?|categories|category|classes|options|choices)"
    r"(?:\s+(?:the\s+)?following)?(?:\s+(?:labels|categories|classes|options))?\s*[:\-]?\s*"
    r"(?:\[(?P<bracketed>[^\]]+)\]|\((?P<paren>[^)]+)\)|(?P<plain>[^\n.:]+))",
    re.I,
)
_TEXT_MARKER = re.compile(
    r"(?:^|\n|\.\s|\s)(?:text|input|transcript|review|message|content|document)\s*:\s*", re.I)
# A line that opens the input section of a longer prompt ("...instructions...\nTranscript: ...").
_SECTION_MARKER = re.compile(
    r"(?:^|\n)[ \t]*(?:call[ \t]+)?(?:text|input|transcript|summary|review|message|content|"
    r"document|email|ticket|call|conversation)[ \t]*:[ \t]*", re.I)
_MAX_PREAMBLE_WORDS = 120
_SPLIT_LABELS = re.compile(r"\s*(?:,|;|\||/|\bor\b)\s*", re.I)


@dataclass
class Request:
    """One chat request taken apart."""

    instruction: str = ""  # system text plus the instruction prefix of the user message
    body: str = ""  # the text to work on
    labels: list[str] = field(default_factory=list)
    max_words: int | None = None


def message_text(content: object) -> str:
    """Chat message content as text (plain string, or a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content
        )
    return "" if content is None else str(content)


def _looks_like_instruction(prefix: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", prefix)]
    if not words or _SPEAKER_PREFIX.match(prefix):
        return False
    if len(words) < _MAX_INSTRUCTION_WORDS:
        return any(w in _INSTRUCTION_WORDS for w in words)
    lead = words[1] if words[0] == "please" and len(words) > 1 else words[0]
    return len(words) <= _MAX_IMPERATIVE_WORDS and lead in _INSTRUCTION_WORDS


def split_instruction(prompt: str) -> tuple[str, str]:
    """(instruction, text), trying in turn: instructions followed by an input section line
    ("Transcript: ..."); the text up to the first ':' when it reads as an instruction; a short
    first line that starts with an instruction word.  Otherwise there is no instruction."""
    section = _SECTION_MARKER.search(prompt)
    if section and section.start() > 0:
        preamble = prompt[:section.start()]
        words = [w.lower() for w in re.findall(r"[A-Za-z]+", preamble)]
        if len(words) <= _MAX_PREAMBLE_WORDS and any(w in _INSTRUCTION_WORDS for w in words):
            return preamble.strip(), prompt[section.end():].strip()
    head, sep, tail = prompt.partition(":")
    if sep and "\n" not in head.strip() and _looks_like_instruction(head):
        return head.strip(), tail.strip()
    first, newline, rest = prompt.strip().partition("\n")
    first_words = re.findall(r"[A-Za-z]+", first)
    if (newline and first_words and len(first.split()) < 25
            and first_words[0].lower() in _INSTRUCTION_WORDS):
        return first.strip(), rest.strip()
    return "", prompt.strip()


def word_limit(instruction: str) -> int | None:
    for pattern in _WORD_LIMITS:
        found = pattern.search(instruction)
        if found:
            return max(1, int(found.group(1)))
    return None


def _clean_label(label: str) -> str:
    return label.strip().strip("'\"`*").strip()


def find_labels(text: str, strict: bool = False) -> tuple[list[str], int]:
    """Labels listed after "one of"/"labels:"/... and where the list ends (0 if none).

    ``strict`` (for text that may be plain prose) only accepts bracketed lists or lists
    introduced by a colon: "I bought one of your blenders, it broke" lists nothing.
    """
    for found in _LABEL_LIST.finditer(text):
        plain = found.group("plain")
        if strict and plain and ":" not in found.group(0):
            continue
        raw = found.group("bracketed") or found.group("paren") or plain or ""
        labels = [_clean_label(x) for x in _SPLIT_LABELS.split(raw)]
        labels = [x for x in labels if x and len(x.split()) <= 6]
        if 2 <= len(labels) <= 50:
            return labels, found.end()
    return [], 0


def parse(messages: list[dict]) -> Request:
    """Take a chat request apart: instruction, body, listed labels, word limit."""
    system = "\n".join(message_text(m.get("content")) for m in messages
                       if m.get("role") in ("system", "developer"))
    users = [message_text(m.get("content")) for m in messages if m.get("role") == "user"]
    prompt = users[-1] if users else ""
    instruction, body = split_instruction(prompt)
    request = Request(instruction=" ".join(x for x in (system, instruction) if x), body=body)

    # A label list may sit in the instruction, in the system message, or right after the
    # instruction's colon ("... into one of: a, b, c\nText: ...").
    labels, _ = find_labels(request.instruction)
    if not labels and instruction and re.search(r"\b(?:one of|labels?|categor|class|options)\b",
                                                instruction, re.I):
        labels, end = find_labels(instruction + ": " + body)
        if labels:
            body = (instruction + ": " + body)[end:].lstrip(" .:\n")
    if not labels and not instruction:
        labels, end = find_labels(prompt[:500], strict=True)
        if labels:
            request.instruction = " ".join(x for x in (system, prompt[:end]) if x)
            body = prompt[end:].lstrip(" .:\n")
    marker = list(_TEXT_MARKER.finditer(body[:400])) if labels else []
    if marker:
        body = body[marker[-1].end():]
    request.labels = labels
    request.body = body.strip()
    request.max_words = word_limit(request.instruction)
    return request


def task_of(instruction: str) -> str | None:
    """The AI-function style task an instruction asks for, if it names one."""
    low = instruction.lower()
    if re.search(r"\b(mask|redact|anonymi[sz]e)", low):
        return "mask"
    if re.search(r"\btranslat", low):
        return "translate"
    if re.search(r"\b(grammar|fix|correct|proofread)", low):
        return "fix_grammar"
    if re.search(r"\bsentiment\b", low):
        return "sentiment"
    if re.search(r"\b(classif|categori[sz]|label)", low):
        return "classify"
    if re.search(r"\b(summar|tl;?dr|brief|condense|shorten)", low):
        return "summarize"
    return None


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_PHONE = re.compile(r"(?:\+?\d{1,2}[\s.-]?)?\(?\b\d{3}\)?[\s.-]?\d{3}[\s.-]?\d{4}\b")
# "my name is" in any case; then one word, plus a second one only if capitalized (a surname).
_NAME = re.compile(r"(\b(?i:my name is)\s+)[A-Za-z]+(?:\s+[A-Z][a-z]+)?")


def mask(text: str) -> str:
    """Replace emails, phone numbers and names after "my name is" with "[MASKED]"."""
    text = _EMAIL.sub("[MASKED]", text)
    text = _PHONE.sub("[MASKED]", text)
    return _NAME.sub(lambda m: m.group(1) + "[MASKED]", text)
