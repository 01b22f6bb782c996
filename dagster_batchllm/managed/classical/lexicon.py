"""Hand-made cue lexicon shared by the local summarizer and classifier.

A *concept* (``"refund"``, ``"high"``, ``"positive"`` ...) is a list of cues: single words or
short phrases, each with a weight.  :func:`find_cues` scans tokenized text once and reports
which cues occur, skipping negated ones ("I'm not upset").  Tokens are lower-case letters only,
apostrophes dropped, so raw text and the Databricks-style cleaned text ("dont", "im") tokenize
the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache


def word_list(text: str) -> list[str]:
    """Word lists are written as one string: easier to read and edit than a list literal."""
    return text.split()


_TOKEN = re.compile(r"[a-z]+(?:['\u2019][a-z]+)*")
_SUFFIXES = ("ingly", "edly", "ing", "ies", "ied", "ed", "ly", "es", "s")

# Negators within a few tokens before a cue cancel it ("not angry", "don't want a refund") ...
NEGATORS = frozenset(word_list(
    "not no never dont didnt doesnt isnt wasnt arent werent wont cant cannot without nothing "
    "hardly neither nor"
))
# ... unless the window also holds a verb of *not yet having* something ("haven't received my
# refund" is a refund request, not its negation).
_UNNEGATE = frozenset(word_list("received receive got get gotten seen yet still processed issued"))
NEGATION_WINDOW = 3

# Words that carry no evidence when they appear in a label ("Refund Request", "Risk Level").
GENERIC_LABEL_WORDS = frozenset(word_list(
    "request requests general other type level category class issue issues the a an of and or "
    "to for with"
))

_CUES: dict[str, dict[str, float]] = {
    # Severity, strongest first: anger, threats to leave, legal or public escalation, urgency.
    "high": {
        "angry": 2, "anger": 2, "angrier": 2, "furious": 2, "livid": 2, "outraged": 2,
        "outrageous": 2, "irate": 2, "enraged": 2, "mad": 1.5, "pissed": 2, "fuming": 2,
        "infuriating": 2, "infuriated": 2, "lawyer": 2, "attorney": 2, "lawsuit": 2, "suing": 2,
        "sue you": 2, "legal action": 2, "going to cancel": 2, "gonna cancel": 2,
        "will cancel": 2, "cancel my account": 2, "cancel my membership": 2,
        "cancel my subscription": 2, "cancelling my": 2, "canceling my": 2, "im cancelling": 2,
        "close my account": 2, "closing my account": 2, "business elsewhere": 2,
        "never shop": 2, "never order": 2, "better business bureau": 2, "bbb": 2,
        "report you": 2, "reporting you": 2, "had it with": 2, "sick of": 1.5,
        "urgent": 1, "urgently": 1, "emergency": 1.5, "immediately": 1, "asap": 1,
        "critical": 1, "unacceptable": 0.5,
    },
    "medium": {
        "upset": 2, "frustrated": 2, "frustrating": 2, "frustration": 2, "disappointed": 2,
        "disappointing": 2, "disappointment": 2, "annoyed": 2, "annoying": 2, "unhappy": 2,
        "not happy": 2, "not satisfied": 2, "dissatisfied": 2, "irritated": 2, "fed up": 2,
        "concerned": 1, "worried": 1, "inconvenient": 1, "inconvenience": 1, "bothered": 1,
        "let down": 1.5, "not pleased": 2,
    },
    "low": {
        "no rush": 1, "no worries": 1, "no problem": 0.5, "just wondering": 1, "curious": 1,
        "quick question": 1, "appreciate": 0.5, "thank": 0.25,
    },
    # Intents: a refund cue is decisive, so it outweighs the complaining that often comes with it.
    "refund": {
        "refund": 4, "refunded": 4, "refunds": 4, "reimburse": 4, "reimbursed": 4,
        "reimbursement": 4, "money back": 4, "charge back": 3, "chargeback": 3,
        "dispute the charge": 3, "credit my card": 3, "credited back": 3, "credit back": 3,
        "my back": 1, "return it for": 2, "send it back": 1, "double charged": 2,
        "overcharged": 2, "charged twice": 2,
    },
    "complaint": {
        "complaint": 3, "complain": 3, "complaining": 3, "unacceptable": 1.5,
        "terrible service": 2, "poor service": 2, "bad service": 2, "worst": 1.5,
        "horrible": 1.5, "awful": 1.5, "rude": 2, "manager": 1.5, "supervisor": 1.5,
        "escalate": 1, "incompetent": 2, "ridiculous": 1, "disgrace": 1.5, "never showed": 1.5,
        "nobody": 0.5, "terrible": 1, "dismissive": 1.5, "wrong model": 1, "feedback": 1,
        "not acceptable": 1.5,
    },
    "inquiry": {
        "question": 1, "wondering": 1, "how do i": 1, "can you tell me": 1, "hours": 1,
        "open": 0.5, "status": 1, "where is my": 1, "tracking": 0.5, "track": 0.5,
        "address": 0.5, "information": 1, "is it possible": 1, "compatible": 1, "warranty": 1,
        "in stock": 1, "policy": 0.5, "price match": 1, "reset my password": 1, "when will": 1,
    },
    "positive": {
        "great": 1, "excellent": 1.5, "love": 1.5, "happy": 1, "satisfied": 1, "amazing": 1.5,
        "wonderful": 1.5, "thank": 0.5, "helpful": 1, "perfect": 1, "good": 0.5,
    },
    "negative": {
        "bad": 1, "terrible": 1.5, "awful": 1.5, "hate": 1.5, "broken": 1, "worst": 1.5,
        "angry": 1, "upset": 1, "disappointed": 1, "poor": 1, "useless": 1.5,
    },
    "billing": {"bill": 1, "billing": 1.5, "charge": 1, "charged": 1, "invoice": 1.5,
                "payment": 1, "card": 0.5},
    "shipping": {"shipping": 1.5, "delivery": 1.5, "deliver": 1, "package": 1, "shipped": 1,
                 "tracking": 1, "arrived": 0.5, "courier": 1},
    "technical": {"error": 1.5, "broken": 1, "not working": 1.5, "crash": 1.5, "login": 1,
                  "password": 1, "bug": 1.5, "wont turn on": 1.5, "stopped working": 1.5},
    "cancellation": {"cancel": 2, "cancellation": 2, "cancelling": 2, "canceling": 2,
                     "terminate": 1.5, "close my account": 2, "unsubscribe": 2},
    "sales": {"buy": 1, "purchase": 1, "price": 1, "quote": 1.5, "discount": 1, "deal": 0.5},
    "spam": {"unsubscribe": 1.5, "winner": 1.5, "prize": 1.5, "click here": 2, "free money": 2},
}

# Words that name a concept inside a label or a field name.
ALIASES: dict[str, str] = {
    **{w: "high" for w in word_list("high critical severe urgent escalate escalation angry anger")},
    **{w: "medium" for w in word_list("medium moderate mid elevated upset frustrated")},
    **{w: "low" for w in word_list("low minor minimal calm normal routine")},
    **{w: "refund" for w in word_list("refund refunds reimbursement reimburse return returns")},
    **{w: "complaint" for w in word_list("complaint complaints complain grievance escalated")},
    **{w: "inquiry" for w in word_list("inquiry enquiry inquiries question questions info "
       "information general")},
    **{w: "positive" for w in word_list("positive pos good happy satisfied favorable")},
    **{w: "negative" for w in word_list("negative neg bad unhappy unfavorable")},
    **{w: "neutral" for w in word_list("neutral indifferent")},
    **{w: "mixed" for w in word_list("mixed ambivalent")},
    **{w: "billing" for w in word_list("billing bill payment payments invoice charge")},
    **{w: "shipping" for w in word_list("shipping delivery shipment logistics")},
    **{w: "technical" for w in word_list("technical tech bug support outage")},
    **{w: "cancellation" for w in word_list("cancellation cancel churn")},
    **{w: "sales" for w in word_list("sales sale purchase pricing")},
    **{w: "spam" for w in word_list("spam junk")},
}
# Concepts that win by default when the text carries no evidence for anything else.
DEFAULT_CONCEPTS = frozenset({"low", "inquiry", "neutral"})
DEFAULT_WORDS = frozenset(word_list("other none unknown neutral normal misc miscellaneous"))
SENTIMENT_CONCEPTS = ("positive", "negative", "neutral", "mixed")
SEVERITY_ORDER = ("high", "medium", "low")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Crude suffix stripping: enough to match "refunds"/"refunded" with "refund"."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens with apostrophes removed ("Don't" -> "dont")."""
    return [t.replace("'", "").replace("\u2019", "") for t in _TOKEN.findall(text.lower())]


@dataclass(frozen=True)
class _Cue:
    concept: str
    words: tuple[str, ...]  # one stem, or the exact tokens of a phrase
    weight: float


def _compile() -> tuple[dict[str, list[_Cue]], dict[str, list[_Cue]]]:
    """Index cues (by stem for words, by first token for phrases) for a one-pass scan.

    Single words match by stem ("refunds" ~ "refund"); phrases match exact tokens, because
    stemming would blur tense ("cancelling my" is a threat, "cancelled my" is history).
    """
    words: dict[str, list[_Cue]] = {}
    phrases: dict[str, list[_Cue]] = {}
    for concept, cues in _CUES.items():
        for phrase, weight in cues.items():
            tokens = tuple(tokenize(phrase))
            if len(tokens) == 1:
                words.setdefault(stem(tokens[0]), []).append(
                    _Cue(concept, (stem(tokens[0]),), float(weight)))
            else:
                phrases.setdefault(tokens[0], []).append(_Cue(concept, tokens, float(weight)))
    return words, phrases


_WORD_CUES, _PHRASE_CUES = _compile()


@dataclass
class Evidence:
    """Cues found in one text: per concept, the distinct cues and where they occurred."""

    scores: dict[str, float] = field(default_factory=dict)
    cues: dict[str, set[tuple[str, ...]]] = field(default_factory=dict)
    positions: dict[str, list[int]] = field(default_factory=dict)

    def score(self, concept: str) -> float:
        return self.scores.get(concept, 0.0)


def negated(tokens: list[str], start: int) -> bool:
    """Whether a negator shortly before ``tokens[start]`` cancels it ("not upset")."""
    window = tokens[max(0, start - NEGATION_WINDOW):start]
    return any(w in NEGATORS for w in window) and not any(w in _UNNEGATE for w in window)


def find_cues(tokens: list[str]) -> Evidence:
    """Scan tokens (from :func:`tokenize`) once; each distinct cue counts once per concept."""
    ev = Evidence()
    for i, token in enumerate(tokens):
        found = [c for c in _PHRASE_CUES.get(token, ()) if tuple(tokens[i:i + len(c.words)])
                 == c.words]
        found += _WORD_CUES.get(stem(token), ())
        for cue in found:
            if negated(tokens, i):
                continue
            seen = ev.cues.setdefault(cue.concept, set())
            if cue.words not in seen:
                seen.add(cue.words)
                ev.scores[cue.concept] = ev.scores.get(cue.concept, 0.0) + cue.weight
            ev.positions.setdefault(cue.concept, []).append(i)
    return ev


def concepts_of(phrase: str) -> tuple[list[str], list[str], bool]:
    """(concepts named by a label or field name, its other content stems, negated?)."""
    concepts: list[str] = []
    words: list[str] = []
    negated = False
    for token in re.split(r"[^a-z]+", phrase.lower()):
        if not token:
            continue
        if token in NEGATORS:
            negated = True
        elif token in ALIASES or stem(token) in ALIASES:
            concept = ALIASES.get(token) or ALIASES[stem(token)]
            if concept not in concepts:
                concepts.append(concept)
        elif token not in GENERIC_LABEL_WORDS:
            words.append(stem(token))
    return concepts, words, negated
