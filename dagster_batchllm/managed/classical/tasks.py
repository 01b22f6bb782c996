"""Reading a chat request: instruction vs. input text, word limits, label lists, task kind.

Prompts arrive as ``"<instruction>: <text>"`` (the Databricks ``ai_query`` idiom), as an
instruction line followed by the text, or with the instruction in a system message.  These
helpers take them apart without any model: regexes over the instruction only, never over the
input text (a transcript may well contain "max 5 words" or a colon).  The one exception is
:func:`open_ended`, which looks at the start of a prompt that has no instruction at all, to
tell "Write a haiku about queues" (a request to generate) from a text to work on.
"""

from __future__ import annotations

import json
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
# A JSON array of strings, as the AI functions write label lists into their system prompts.
_JSON_LIST = re.compile(r'\[\s*"(?:[^"\\]|\\.)*"(?:\s*,\s*"(?:[^"\\]|\\.)*")*\s*\]')


@dataclass
class Request:
    """One chat request taken apart."""

    instruction: str = ""  # system text plus the instruction prefix of the user message
    body: str = ""  # the text to work on
    labels: list[str] = field(default_factory=list)
    max_words: int | None = None
    prompt: str = ""  # the last user message, untouched
    system: str = ""  # the system (and developer) messages
    user_instruction: str = ""  # the instruction prefix of the user message alone

    @property
    def task(self) -> str | None:
        """The task asked for; a system message that names one wins (the AI functions put
        the task there and send the content alone as the user message).  Listed labels are
        no cue: classifying into ["translation request", "other"] is not a translation."""
        return task_of(self._without_labels(self.system)) \
            or task_of(self._without_labels(self.instruction))

    def _without_labels(self, text: str) -> str:
        text = _JSON_LIST.sub(" ", text)
        for label in self.labels:
            text = text.replace(label, " ")
        return text


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
    """Take a chat request apart: instruction, body, listed labels, word limit.

    When the system message names the task, the user message is all content: its first
    line is not read as an instruction, nor a list in it as the labels.
    """
    system = "\n".join(message_text(m.get("content")) for m in messages
                       if m.get("role") in ("system", "developer"))
    users = [message_text(m.get("content")) for m in messages if m.get("role") == "user"]
    prompt = users[-1] if users else ""
    content_only = task_of(_JSON_LIST.sub(" ", system)) is not None
    instruction, body = ("", prompt.strip()) if content_only else split_instruction(prompt)
    request = Request(instruction=" ".join(x for x in (system, instruction) if x), body=body,
                      prompt=prompt, system=system, user_instruction=instruction)

    # A label list may sit in the instruction, in the system message, or right after the
    # instruction's colon ("... into one of: a, b, c\nText: ...").
    labels, _ = find_labels(request.instruction)
    if not labels and instruction and re.search(r"\b(?:one of|labels?|categor|class|options)\b",
                                                instruction, re.I):
        labels, end = find_labels(instruction + ": " + body)
        if labels:
            body = (instruction + ": " + body)[end:].lstrip(" .:\n")
    if not labels and not instruction and not content_only:
        labels, end = find_labels(prompt[:500], strict=True)
        if labels:
            request.instruction = " ".join(x for x in (system, prompt[:end]) if x)
            body = prompt[end:].lstrip(" .:\n")
    marker = list(_TEXT_MARKER.finditer(body[:400])) if labels and not content_only else []
    if marker:
        body = body[marker[-1].end():]
    request.labels = labels
    request.body = body.strip()
    request.max_words = word_limit(request.instruction)
    return request


# What an instruction asks for, by the words it uses; the first match wins.  Grammar needs
# its own words: "fix" or "correct" alone also appear in "pick the correct label".
_TASK_CUES = (
    ("mask", re.compile(r"\b(mask|redact|anonymi[sz]e)")),
    ("translate", re.compile(r"\btranslat")),
    ("fix_grammar", re.compile(r"\b(grammar|grammatical|spelling|proofread|typos?\b)")),
    ("similarity", re.compile(r"\bsimilar")),
    ("sentiment", re.compile(r"\bsentiment\b")),
    ("classify", re.compile(r"\b(classif|categori[sz]|label)")),
    ("summarize", re.compile(r"\b(summar|tl;?dr|brief|condense|shorten)")),
    ("extract", re.compile(r"\b(extract|pull out)")),
)


def task_of(instruction: str) -> str | None:
    """The AI-function style task an instruction asks for, if it names one."""
    low = instruction.lower()
    return next((task for task, cue in _TASK_CUES if cue.search(low)), None)


# A prompt that asks for text to be made up, or for an answer the text does not hold.
_GENERATE = re.compile(
    r"^\W*(?:please\s+|kindly\s+|(?:can|could|would|will) you\s+(?:please\s+)?)?"
    r"(?:write|generate|compose|create|draft|invent|imagine|brainstorm|suggest|recommend|propose|"
    r"explain|describe|tell|answer|respond|reply|rewrite|rephrase|paraphrase|continue|complete|"
    r"elaborate|expand|outline|plan|design|convert|calculate|solve|code|implement|act as|"
    r"pretend|make up|come up with|give me|list|help me)\b", re.I)
_QUESTION = re.compile(
    r"^\W*(?:what|who|whom|whose|why|how|when|where|which|is|are|was|were|do|does|did|can|could|"
    r"would|will|should|shall|may|might|have|has)\b[^\n]*\?\s*$", re.I)
_MAX_QUESTION_WORDS = 40
_SPEAKER_TURN = re.compile(r"\b(?:agent|customer|caller|rep)\s*:", re.I)


def open_ended(request: Request) -> str | None:
    """What a request asks that no classical method can answer, or ``None``.

    Looked at only when no task is named: the user's instruction, or (with no instruction) the
    prompt itself, when it starts like a request to generate ("Write ...", "Explain ...") or is
    one short question ("What is the capital of France?").  ``None`` leaves the model's
    default task (the summarizer summarizes, the classifier classifies).
    """
    asked = request.user_instruction or request.body
    if _GENERATE.match(asked):
        return "generate free text (this request asks to write or explain something)"
    short = len(asked.split()) <= _MAX_QUESTION_WORDS
    if short and _QUESTION.match(asked) and not _SPEAKER_TURN.search(asked):
        return "answer open questions (only summarize, classify, extract and mask text)"
    return None



def listed_labels(request: Request) -> list[str]:
    """Labels the instruction lists: a JSON array (as the AI functions send), else a label
    list ("one of: a, b"), else none."""
    found = _JSON_LIST.search(request.instruction)
    if found:
        try:
            return [str(label) for label in json.loads(found.group(0))]
        except ValueError:  # an escape JSON does not know: read it as a plain list instead
            pass
    return list(request.labels)


_PAIR = re.compile(r"^\s*Text 1:\s*\n(?P<first>.*?)\n\s*\nText 2:\s*\n(?P<second>.*)$", re.S)


def text_pair(prompt: str) -> tuple[str, str] | None:
    """The two texts of an ``ai_similarity`` prompt ("Text 1:\\n...\\n\\nText 2:\\n...")."""
    found = _PAIR.match(prompt)
    return (found.group("first"), found.group("second").rstrip()) if found else None
