"""Lexicon + VADER label picker for arbitrary label sets.

Three strategies, chosen by what the labels name:

* sentiment sets (positive/negative/neutral/mixed, or star ratings "1".."5"): VADER;
* severity sets (High/Medium/Low, urgent/not urgent): the most severe level with evidence,
  because an angry caller is also frustrated and the worse signal is the one that matters;
* anything else: cue evidence for the concepts each label names, plus overlap of the label's
  own words with the text, plus a small prior for "default" labels (Low, General Inquiry,
  Other, not-X) so they win when nothing else has evidence.  Ties go to the earlier label.
"""

from __future__ import annotations

import re
import threading
from functools import cached_property

from dagster_batchllm.managed.classical.lexicon import (
    DEFAULT_CONCEPTS,
    DEFAULT_WORDS,
    SENTIMENT_CONCEPTS,
    SEVERITY_ORDER,
    Evidence,
    concepts_of,
    find_cues,
    stem,
    tokenize,
)
from dagster_batchllm.managed.classical.summarizer import DEFAULT_WORDS as SUMMARY_WORDS
from dagster_batchllm.managed.classical.summarizer import summarize

_VADER_MAX_CHARS = 6000  # VADER is linear in length; the opening of a long call says enough
# Speaker turns: "Customer: ..." in raw text, a bare "customer ..." once punctuation is gone.
_TAGGED_TURN = re.compile(
    r"\b(agent|rep|representative|operator|customer|caller|cust|client)\s*:", re.I)
_BARE_TURN = re.compile(r"\b(agent|rep|representative|operator|customer|caller|cust|client)\b")
_CUSTOMER_TAGS = frozenset({"customer", "caller", "cust", "client"})
_MIN_BARE_TURNS = 4
_DEFAULT_PRIOR = 0.5
_vader_lock = threading.Lock()
_vader = None


def _analyzer():
    """The shared VADER analyzer, built once (it loads a 7,500-word lexicon)."""
    global _vader
    if _vader is None:
        with _vader_lock:
            if _vader is None:
                from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

                _vader = SentimentIntensityAnalyzer()
    return _vader


def customer_voice(text: str) -> str:
    """The customer's turns of a transcript, or the whole text when it has no speakers.

    Sentiment is the customer's: agents are polite by trade ("thank you", "happy to help"),
    and scoring their words makes an angry call look positive.
    """
    turns = list(_TAGGED_TURN.finditer(text))
    if len(turns) < 2 and not re.search(r"[.,!?]", text):
        # Bare speaker words only count in unpunctuated (cleaned) text, and only when there
        # are several: "the agent told the customer" is prose, not a transcript.
        turns = list(_BARE_TURN.finditer(text))
        if len(turns) < _MIN_BARE_TURNS:
            return text
    if len(turns) < 2:
        return text
    spans = [(m.group(1).lower(), m.end(), nxt.start() if nxt else len(text))
             for m, nxt in zip(turns, [*turns[1:], None], strict=True)]
    said = "\n".join(text[a:b] for who, a, b in spans if who in _CUSTOMER_TAGS)
    return said if len(said.split()) >= 3 else text


class TextContext:
    """One input text with its tokens, cue evidence and (lazily) sentiment and summary."""

    def __init__(self, text: str) -> None:
        self.text = text or ""
        self.tokens = tokenize(self.text)
        self.stems = [stem(t) for t in self.tokens]
        self.stem_set = frozenset(self.stems)
        self.evidence: Evidence = find_cues(self.tokens)
        self._summaries: dict[int, str] = {}

    @cached_property
    def voice(self) -> str:
        return customer_voice(self.text)

    @cached_property
    def polarity(self) -> dict[str, float]:
        """VADER scores of the customer's words: neg/neu/pos proportions and compound."""
        if not self.text.strip():
            return {"neg": 0.0, "neu": 1.0, "pos": 0.0, "compound": 0.0}
        return _analyzer().polarity_scores(self.voice[:_VADER_MAX_CHARS])

    @cached_property
    def voice_evidence(self) -> Evidence:
        return self.evidence if self.voice is self.text else find_cues(tokenize(self.voice))

    @property
    def compound(self) -> float:
        return float(self.polarity["compound"])

    def sentiment_score(self) -> float:
        """VADER's compound pulled towards the emotion cues, clipped to [-1, 1]."""
        ev = self.voice_evidence
        neg_cues = ev.score("negative") + ev.score("high") + ev.score("medium")
        score = self.compound + 0.2 * ev.score("positive") - 0.3 * neg_cues
        return max(-1.0, min(1.0, score))

    def sentiment(self) -> str:
        """positive / negative / neutral / mixed, as Databricks' ai_analyze_sentiment answers.

        VADER's compound score, pulled towards the emotion cues: VADER reads "Hi ... Fine.
        Thanks." as positive even when the same caller is "really angry".
        """
        ev, p = self.voice_evidence, self.polarity
        pos_cues = ev.score("positive")
        neg_cues = ev.score("negative") + ev.score("high") + ev.score("medium")
        score = self.sentiment_score()
        strong_pos = p["pos"] >= 0.2 or pos_cues >= 1.5
        strong_neg = p["neg"] >= 0.2 or neg_cues >= 1
        if strong_pos and strong_neg and (abs(score) < 0.25 or min(p["pos"], p["neg"]) >= 0.15):
            return "mixed"
        if score >= 0.05:
            return "positive"
        if score <= -0.05:
            return "negative"
        return "neutral"

    def summary(self, max_words: int = SUMMARY_WORDS) -> str:
        if max_words not in self._summaries:
            self._summaries[max_words] = summarize(self.text, max_words)
        return self._summaries[max_words]

    def concept_score(self, concept: str) -> float:
        """Cue evidence, with VADER folded in for the sentiment concepts."""
        score = self.evidence.score(concept)
        if concept == "positive":
            score += 3.0 * max(0.0, self.sentiment_score())
        elif concept == "negative":
            score += 3.0 * max(0.0, -self.sentiment_score())
        elif concept in ("neutral", "mixed"):
            score += 2.0 if self.sentiment() == concept else 0.0
        return score

    def severity(self) -> str:
        """high / medium / low from anger, frustration and, failing cues, VADER."""
        high, medium = self.evidence.score("high"), self.evidence.score("medium")
        if high >= 2:
            return "high"
        if medium >= 1 or high >= 1:
            return "medium"
        if self.stems and self.compound <= -0.75 and self.evidence.score("low") == 0:
            return "medium"  # strongly negative without a named emotion
        return "low"


def _is_number(label: str) -> bool:
    return label.strip().lstrip("-").replace(".", "", 1).isdigit()


def _pick_sentiment(labels: list[str], ctx: TextContext) -> str:
    if all(_is_number(lab) for lab in labels):  # a rating scale: map sentiment onto it
        ordered = sorted(labels, key=float)
        return ordered[round((ctx.sentiment_score() + 1.0) / 2.0 * (len(ordered) - 1))]
    by_concept = {}
    for label in labels:
        for concept in concepts_of(label)[0]:
            by_concept.setdefault(concept, label)
    wanted = ctx.sentiment()
    fallbacks = {"mixed": ("mixed", "neutral"), "neutral": ("neutral", "mixed")}
    for concept in fallbacks.get(wanted, (wanted,)):
        if concept in by_concept:
            return by_concept[concept]
    lean = "positive" if ctx.sentiment_score() >= 0 else "negative"
    return by_concept.get(lean) or labels[0]


def _pick_severity(labels: list[str], levels: list[str], ctx: TextContext) -> str:
    level = ctx.severity()
    rank = SEVERITY_ORDER.index(level)
    # Missing level: round towards the more severe one unless there is no evidence at all.
    order = SEVERITY_ORDER[rank::-1] + SEVERITY_ORDER[rank + 1:] if level != "low" \
        else SEVERITY_ORDER[::-1]
    for wanted in order:
        if wanted in levels:
            return labels[levels.index(wanted)]
    return labels[0]


def _label_level(label: str) -> str | None:
    concepts, _, negated = concepts_of(label)
    levels = [c for c in concepts if c in SEVERITY_ORDER]
    if not levels:
        return None
    return "low" if negated else levels[0]


def choose_label(labels: list[str], ctx: TextContext) -> str:
    """The label that best fits the text; deterministic, ties resolved by label order."""
    labels = [str(lab) for lab in labels]
    if not labels:
        return ctx.sentiment()
    if len(labels) == 1:
        return labels[0]
    infos = [concepts_of(lab) for lab in labels]
    sentiment_set = all(c and set(c) <= set(SENTIMENT_CONCEPTS) for c, _, _ in infos)
    if sentiment_set or all(_is_number(lab) for lab in labels):
        return _pick_sentiment(labels, ctx)
    levels = [_label_level(lab) for lab in labels]
    if all(levels):
        return _pick_severity(labels, levels, ctx)

    best, best_score = labels[0], float("-inf")
    for label, (concepts, words, negated) in zip(labels, infos, strict=True):
        evidence = sum(ctx.concept_score(c) for c in concepts)
        overlap = sum(1.0 for w in set(words) if w in ctx.stem_set)
        score = 0.0 if negated else evidence + overlap
        default = set(concepts) & DEFAULT_CONCEPTS or set(label.lower().split()) & DEFAULT_WORDS
        if negated or default:
            score += _DEFAULT_PRIOR
        if score > best_score:
            best, best_score = label, score
    return best
