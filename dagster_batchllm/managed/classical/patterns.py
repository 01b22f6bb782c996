"""Personal data and entities found by pattern: what masking and extraction can do classically.

An entity *kind* is one regular expression (plus a checksum for card numbers).  The kinds:

``email``, ``phone`` (North American numbers, 7-digit local numbers, ``+``-prefixed international
ones), ``card`` (13-19 digit runs, spaces or dashes allowed, that pass the Luhn check), ``iban``
(two letters, two check digits, 11-30 letters/digits), ``ssn`` (``123-45-6789``), ``person``
(only where the text introduces one: "my name is ...", "this is ...", "speaking with ...",
Mr./Ms./Dr. ..., or two capitalised words that are not common words: "John Smith called"),
``date`` (ISO, 10/28 or 10/28/2026, "October 28", "Oct 28th", "28 October 2026"), ``time``,
``order`` (an order, reference, ticket, case, invoice or tracking number), ``account`` (an
account, customer or member number), ``money`` ($49.99, 49.99 dollars, EUR 20), ``product``
(the words after "ordered/bought/purchased/returning a ..."), ``address`` (a street address),
``url``.

:func:`kind_of` reads which kind a label or field name asks for ("customer_name" -> person,
"order number" -> order, "price" -> money); a label it cannot read has no kind, and the
callers answer null for it: there is no pattern for it, so nothing is made up.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable

from dagster_batchllm.managed.classical.lexicon import word_list

MASK = "[MASKED]"
_MONTHS = ("jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
           "sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?")
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
# Capitalised words that start sentences or name things other than people.
_NOT_NAMES = frozenset(word_list("""
    I A An The This That These Those My Your Our Their His Her Its We You They He She It Hi Hello
    Hey Thanks Thank Please Sure Okay Ok Yes No Yeah Well So And But Or If When What Why How Who
    Where Which Agent Customer Caller Rep Cust Client Operator Good Great Perfect Sorry Dear Mr
    Mrs Ms Dr Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March
    April May June July August September October November December Service Support Street St
    Avenue Ave Road Rd Lane Ln Drive Boulevard Blvd Order Account Card Store Home Team Care
    Better Business Bureau
    """))
_NAME_WORD = r"[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)?"

PATTERNS: dict[str, re.Pattern[str]] = {
    "email": re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"),
    "url": re.compile(r"\bhttps?://[^\s<>\"')]+|\bwww\.[\w-]+(?:\.[\w-]+)+[^\s<>\"')]*"),
    "iban": re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b"),
    "card": re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])"),
    "ssn": re.compile(r"(?<![\w-])\d{3}-\d{2}-\d{4}(?![\w-])"),
    "phone": re.compile(
        r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{3}\)\s?|\b\d{3}[\s.-])\d{3}[\s.-]\d{4}\b"
        r"|(?<![\w+])\+\d{1,3}(?:[\s.-]?\d{2,4}){2,5}\b"
        r"|(?<![\w.$-])\b\d{3}-\d{4}\b(?![\w-])"),
    "date": re.compile(
        rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|(?<![\w/$.])\d{{1,2}}/\d{{1,2}}(?:/\d{{2,4}})?\b(?![/.]\d)"
        rf"|\b(?:{_MONTHS})\.? {_DAY}(?:,? \d{{4}})?\b"
        rf"|\b{_DAY} (?:of )?(?:{_MONTHS})(?:,? \d{{4}})?\b",
        re.I),
    "time": re.compile(r"\b\d{1,2}(?::\d{2})? ?(?:[ap]\.?m\.?)(?!\w)|\b\d{1,2}:\d{2}\b", re.I),
    "money": re.compile(
        r"[$€£]\s?\d[\d,]*(?:\.\d{1,2})?|\b(?:USD|EUR|GBP)\s?\d[\d,]*(?:\.\d{1,2})?"
        r"|\b\d[\d,]*(?:\.\d{1,2})?\s?(?:dollars|bucks|euros?|pounds|usd|eur|gbp)\b", re.I),
    "order": re.compile(
        r"\b(?:order|ref(?:erence)?|ticket|case|invoice|confirmation|tracking|booking)"
        r"(?:\s+(?:number|no\.?|id|code))?\s*(?:is\s+)?[:#]?\s*"
        r"(#?[A-Z]{0,4}-?\d[\dA-Z-]{3,})", re.I),
    "account": re.compile(
        r"\b(?:account|customer|member|membership|client)\s+(?:number|no\.?|id|#)\s*"
        r"(?:is\s+)?[:#]?\s*([A-Z]{0,5}-?\d[\dA-Z-]{2,})", re.I),
    "person": re.compile(
        rf"\b(?i:my name is|name's|this is|speaking with|i am|i'm|call me)\s+({_NAME_WORD}"
        rf"(?:\s+{_NAME_WORD})?)|\b(?:Mr|Mrs|Ms|Miss|Dr)\.?\s+({_NAME_WORD}(?:\s+{_NAME_WORD})?)"
        rf"|\b({_NAME_WORD}\s+{_NAME_WORD})\b"),
    "product": re.compile(
        r"\b(?:ordered|bought|purchased|returned|returning|return|exchange|replace)\s+"
        r"(?:a|an|the|my|this|that|two|three|some|new)\s+((?:[a-z][\w-]*\s){0,2}[a-z][\w-]*?)"
        r"(?=\s+(?:on|from|for|last|yesterday|today|and|but|that|which|it|because|in|online)\b"
        r"|[,.;!?]|$)", re.I),
    "address": re.compile(
        r"\b\d{1,6}\s+(?:[A-Z][a-z]+\s){1,3}(?:St|Street|Ave|Avenue|Rd|Road|Blvd|Boulevard|Ln|"
        r"Lane|Dr|Drive|Ct|Court|Way|Pl|Place)\b\.?(?:,\s*[A-Z][a-z]+(?:\s[A-Z][a-z]+)?)?"),
}

# Which kind a label asks for, by its words, checked in this order ("customer id" is an
# account, not a person; "email address" is an email, not an address).
_LABEL_KINDS: tuple[tuple[str | None, re.Pattern[str]], ...] = (
    ("email", re.compile(r"\be-?mail")),
    ("url", re.compile(r"\b(?:url|website|web site|link|web address)")),
    ("iban", re.compile(r"\b(?:iban|bank account)")),
    ("card", re.compile(r"\b(?:card|credit|debit|cc|pan)\b")),
    ("ssn", re.compile(r"\b(?:ssn|social security|national id|national insurance)")),
    ("phone", re.compile(r"\b(?:phone|telephone|mobile|cell|fax|contact number|tel)\b")),
    ("order", re.compile(r"\b(?:order|reference|ref|ticket|case|invoice|confirmation|tracking|"
                         r"booking)\b")),
    ("account", re.compile(r"\b(?:account|customer|member|client)\s*(?:id|number|no)\b")),
    ("money", re.compile(r"\b(?:amount|price|cost|total|charge|fee|payment|money|balance|"
                         r"refund)\b")),
    ("date", re.compile(r"\b(?:date|day|dob|birth(?:day|date)?|when)\b")),
    ("time", re.compile(r"\b(?:time|hour|hours)\b")),
    ("address", re.compile(r"\b(?:address|street)\b")),
    ("product", re.compile(r"\b(?:product|item|device|appliance|merchandise|goods|purchase)")),
    # Named things that are not people, and places: no pattern tells them apart reliably.
    (None, re.compile(r"\b(?:company|organi[sz]ation|business|brand|store|shop|vendor|merchant|"
                      r"city|town|country|state|location|place|region)\b")),
    ("person", re.compile(r"\b(?:person|people|name|names|customer|caller|agent|client|"
                          r"employee|representative|who)\b")),
)
# Labels that ask for every kind of personal data at once.
_ALL_PERSONAL = re.compile(r"\b(?:pii|personal|private|sensitive|contact (?:details|info)|"
                           r"identif)")
PERSONAL_KINDS = ("email", "iban", "card", "ssn", "phone", "person", "address")


def _normalized(label: str) -> str:
    return re.sub(r"[_\-\s]+", " ", re.sub(r"([a-z])([A-Z])", r"\1 \2", label)).lower().strip()


def kind_of(label: str) -> str | None:
    """The entity kind a label or field name asks for, or ``None`` when no pattern fits."""
    low = _normalized(label)
    return next((kind for kind, cue in _LABEL_KINDS if cue.search(low)), None)


def kinds_to_mask(labels: Iterable[str]) -> tuple[list[str], list[str]]:
    """(kinds to mask, labels no pattern can find) for ``ai_mask`` style labels."""
    kinds: list[str] = []
    unknown: list[str] = []
    for label in labels:
        wanted = list(PERSONAL_KINDS) if _ALL_PERSONAL.search(_normalized(label)) \
            else [kind_of(label)]
        if wanted == [None]:
            unknown.append(label)
        kinds.extend(k for k in wanted if k is not None and k not in kinds)
    return kinds, unknown


def luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _is_card(candidate: str) -> bool:
    digits = re.sub(r"\D", "", candidate)
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _person_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for found in PATTERNS["person"].finditer(text):
        group = next(g for g in (1, 2, 3) if found.group(g))
        words = found.group(group).split()
        if group == 3 and any(w in _NOT_NAMES for w in words):
            continue  # "Thank You", "Customer Service": capitalised, but not a name
        while words and words[-1] in _NOT_NAMES:
            words.pop()  # "this is Maria Customer" in a flattened transcript
        if words and words[0] not in _NOT_NAMES:
            start = found.start(group)
            spans.append((start, start + len(" ".join(words))))
    return spans


def _is_day_and_month(candidate: str) -> bool:
    """"10/28" is a date; "4/5" (a rating) and "24/7" (the idiom) are not."""
    if candidate.count("/") == 2:
        return True
    parts = [int(p) for p in candidate.split("/")]
    return candidate != "24/7" and all(1 <= p <= 31 for p in parts) and min(parts) <= 12 \
        and max(parts) > 5


def spans(kind: str, text: str) -> list[tuple[int, int]]:
    """Where ``kind`` occurs in ``text``: (start, end) of each entity, in order."""
    if kind == "person":
        return _person_spans(text)
    pattern = PATTERNS[kind]
    found = []
    for match in pattern.finditer(text):
        group = 1 if pattern.groups and match.group(1) else 0
        value = match.group(0)
        if kind == "card" and not _is_card(value):
            continue
        if kind == "date" and re.fullmatch(r"[\d/]+", value) and not _is_day_and_month(value):
            continue
        found.append((match.start(group), match.end(group)))
    return found


def find_all(kind: str, text: str) -> list[str]:
    """Every ``kind`` entity in ``text``, as written, in order, without repeats."""
    seen: dict[str, None] = {}
    for start, end in spans(kind, text):
        seen.setdefault(text[start:end].strip(" .,"), None)
    return [value for value in seen if value]


def find(kind: str, text: str) -> str | None:
    """The first ``kind`` entity in ``text`` as written, or ``None``."""
    found = find_all(kind, text)
    return found[0] if found else None


_DATE_FORMATS = ("%Y-%m-%d", "%m/%d/%Y", "%m/%d/%y", "%B %d %Y", "%b %d %Y", "%d %B %Y",
                 "%d %b %Y")
_DATETIME = re.compile(r"\b(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})(:\d{2}(?:\.\d+)?)?"
                       r"(Z|[+-]\d{2}:?\d{2})?")


def iso_date(text: str) -> str | None:
    """The first date of ``text`` that names its year, as ``YYYY-MM-DD`` ("10/28" has none)."""
    for value in find_all("date", text):
        cleaned = re.sub(r"(\d)(?:st|nd|rd|th)\b", r"\1", value)
        cleaned = re.sub(r"\s+", " ", cleaned.replace(",", " ").replace(".", " ")
                         .replace(" of ", " ")).strip()
        for fmt in _DATE_FORMATS:
            try:
                return dt.datetime.strptime(cleaned, fmt).date().isoformat()
            except ValueError:
                continue
    return None


def iso_datetime(text: str) -> str | None:
    """The first ISO date with a time in ``text`` ("2026-11-01 10:30" -> "2026-11-01T10:30:00")."""
    found = _DATETIME.search(text)
    if not found:
        return None
    day, clock, seconds, zone = found.groups()
    return f"{day}T{clock}{seconds or ':00'}{zone or ''}"


def mask(text: str, kinds: Iterable[str] = PERSONAL_KINDS) -> str:
    """``text`` with every entity of ``kinds`` replaced by ``[MASKED]``.

    Kinds are masked in a fixed order, longest patterns first (a card number is not also
    masked as phone numbers), each on the text the previous kinds left.
    """
    wanted = set(kinds)
    for kind in ("email", "url", "iban", "card", "ssn", "phone", "address", "date", "time",
                 "money", "order", "account", "person", "product"):
        if kind in wanted:
            text = _replace(text, spans(kind, text))
    return text


def _replace(text: str, found: list[tuple[int, int]]) -> str:
    for start, end in sorted(found, reverse=True):
        text = text[:start] + MASK + text[end:]
    return text
