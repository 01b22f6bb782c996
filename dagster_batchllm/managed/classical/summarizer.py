"""Extractive summarizer: keep the most informative sentences, in their original order.

Sentences are scored by content-word frequency (YAKE keyword weights join in for long texts,
where raw frequency is diluted by small talk) plus a large bonus for sentiment and intent
cues, so a summary of an angry refund call keeps the words ("angry", "refund") that
downstream ``LIKE '%refund%'`` rules look for.  Text with no sentence punctuation (the
Databricks example strips everything but letters) is split at speaker words and then into
fixed-size word windows.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from dagster_batchllm.managed.classical.lexicon import find_cues, negated, stem, tokenize, word_list

DEFAULT_WORDS = 40
WINDOW_WORDS = 20  # unit size when a text has no usable sentence boundaries
_YAKE_MIN_WORDS = 250  # below this, YAKE costs more than it adds over plain frequency

_SPEAKERS = r"agent|customer|caller|cust|rep|representative|client|operator"
_SPEAKER_TAG = re.compile(rf"\s*\b(?:{_SPEAKERS})\b\s*(?:\([^)]*\))?\s*[:\-\u2013]\s*", re.I)
_SPEAKER_WORD = re.compile(rf"\s+(?=\b(?:{_SPEAKERS})\b)", re.I)
_LEADING_SPEAKER = re.compile(rf"^\s*(?:{_SPEAKERS})\b\s*(?:\([^)]*\))?\s*[:\-\u2013]?\s*", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# What a summary must keep when the text has it, most important first: the literal words
# that classic post-processing rules test (LIKE '%refund%'), then the cue concepts that the
# classifier reads.  Negated mentions ("not upset") do not count.
SIGNAL_WORDS = ("refund", "angry", "upset", "complaint")
SIGNAL_CONCEPTS = ("refund", "high", "complaint", "medium")
SIGNALS = tuple(f"word:{w}" for w in SIGNAL_WORDS) + SIGNAL_CONCEPTS
_CONCEPT_BONUS = {"refund": 3.0, "high": 3.0, "complaint": 2.5, "medium": 2.5}

_STOPWORDS = frozenset(word_list(
    """a about above after again all also am an and any are as at be because been before being
    but by can could did do does doing for from had has have having he her here hers him his how
    i if in into is it its itself just me more most my myself no nor not now of off on once only
    or other our ours out over own same she should so some such than that the their theirs them
    then there these they this those through to too under until up very was we were what when
    where which while who whom why will with would you your yours yourself yeah okay ok um uh like
    hi hello thanks thank please sure right well oh got get let one know im its dont thats ive
    agent customer caller cust rep"""
))

_yake_lock = threading.Lock()
_yake = None


def _yake_keywords(text: str) -> dict[str, float]:
    """Keyword -> weight in (0, 1] from YAKE (lower YAKE scores are better keywords)."""
    global _yake
    with _yake_lock:  # YAKE does not promise thread safety; only long texts get here
        if _yake is None:
            import yake

            _yake = yake.KeywordExtractor(lan="en", n=1, top=20)
        found = _yake.extract_keywords(text)
    return {stem(k.lower()): 1.0 / (1.0 + 20.0 * float(s)) for k, s in found}


@dataclass
class _Unit:
    index: int
    text: str
    tokens: list[str]
    stems: list[str]
    score: float = 0.0
    signals: dict[str, list[int]] = field(default_factory=dict)  # signal -> token positions


def _signals(tokens: list[str]) -> dict[str, list[int]]:
    evidence = find_cues(tokens)
    found = {c: evidence.positions[c] for c in SIGNAL_CONCEPTS if c in evidence.positions}
    for i, token in enumerate(tokens):
        for word in SIGNAL_WORDS:
            if word in token and not negated(tokens, i):
                found.setdefault(f"word:{word}", []).append(i)
    return found


def split_units(text: str) -> list[str]:
    """Sentences, falling back to speaker turns and then word windows for unpunctuated text."""
    pieces: list[str] = []
    for line in re.split(r"[\r\n]+", text):
        for turn in _SPEAKER_TAG.split(line):
            if len(turn.split()) > 2 * WINDOW_WORDS and not _SENTENCE_END.search(turn):
                turn = "\n".join(_SPEAKER_WORD.split(turn))  # cleaned text: "... customer hi"
            for part in re.split(r"\n", turn):
                pieces.extend(_SENTENCE_END.split(part))
    units: list[str] = []
    for piece in pieces:
        piece = _LEADING_SPEAKER.sub("", piece).strip()
        words = piece.split()
        if not words:
            continue
        if len(words) <= 2 * WINDOW_WORDS:
            units.append(" ".join(words))  # cleaned text leaves runs of spaces behind
        else:
            units.extend(" ".join(words[i:i + WINDOW_WORDS])
                         for i in range(0, len(words), WINDOW_WORDS))
    return units


def _score(units: list[_Unit], text: str, n_words: int) -> None:
    counts: dict[str, int] = {}
    for unit in units:
        for s in unit.stems:
            if s not in _STOPWORDS and len(s) > 2:
                counts[s] = counts.get(s, 0) + 1
    top = max(counts.values(), default=1)
    keywords = _yake_keywords(text) if n_words >= _YAKE_MIN_WORDS else {}
    for unit in units:
        unit.signals = _signals(unit.tokens)
        content = [s for s in unit.stems if s not in _STOPWORDS and len(s) > 2]
        if not content:
            continue
        freq = sum(counts[s] / top + keywords.get(s, 0.0) for s in content)
        unit.score = freq / (len(unit.stems) ** 0.5)
        unit.score += sum(_CONCEPT_BONUS[c] for c in SIGNAL_CONCEPTS if c in unit.signals)


def _clip(unit: _Unit, budget: int) -> str:
    """The unit cut to ``budget`` words, placed to keep as many signal cues as possible."""
    words = unit.text.split()
    if len(words) <= budget:
        return unit.text
    # Cue positions count tokens; map them to whitespace words ("$49.99" has no token).
    word_of = [w for w, word in enumerate(words) for _ in tokenize(word)]
    hits = sorted({word_of[p] for positions in unit.signals.values() for p in positions
                   if p < len(word_of)})
    if not hits:
        return " ".join(words[:budget])
    # Room for a two-word cue's tail ("money back") after the last hit kept.
    span = max(1, budget - 1)
    start = max(hits, key=lambda h: sum(h <= x < h + span for x in hits))
    start = max(0, min(start, len(words) - budget))
    return " ".join(words[start:start + budget])


def summarize(text: str, max_words: int = DEFAULT_WORDS) -> str:
    """An extractive summary of at most ``max_words`` words.

    Empty or whitespace-only input gives ``""`` (there is nothing to summarize); any input
    with at least one word gives a non-empty summary.
    """
    max_words = max(1, int(max_words))
    raw_units = split_units(text)
    if not raw_units:
        return ""
    units: list[_Unit] = []
    seen: set[str] = set()
    for i, piece in enumerate(raw_units):
        tokens = tokenize(piece)
        key = " ".join(tokens) or piece
        if key not in seen:  # long calls repeat themselves; one copy is enough
            seen.add(key)
            units.append(_Unit(i, piece, tokens, [stem(t) for t in tokens]))
    _score(units, text, sum(len(u.stems) for u in units))
    ranked = sorted(units, key=lambda u: (-u.score, u.index))

    chosen: dict[int, str] = {}
    covered: set[str] = set()
    budget = max_words
    # Coverage first: the best unit for each signal present, clipped if need be.
    for signal in SIGNALS:
        if budget < 1 or signal in covered:
            continue
        for unit in ranked:
            if unit.index not in chosen and signal in unit.signals:
                piece = _clip(unit, budget)
                chosen[unit.index] = piece
                budget -= len(piece.split())
                covered.update(_signals(tokenize(piece)))
                break
    for unit in ranked:
        n = len(unit.text.split())
        if unit.index not in chosen and n <= budget and unit.score > 0:
            chosen[unit.index] = unit.text
            budget -= n
    if not chosen:
        chosen[ranked[0].index] = _clip(ranked[0], max_words)
    return " ".join(chosen[i] for i in sorted(chosen))
