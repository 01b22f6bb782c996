"""Secrets taken out of what a server says, before it is kept anywhere.

A server (or a proxy in front of it) may quote the request's headers in its error text: a 401
that says ``invalid header 'Authorization: Bearer sk-...'``. That text becomes a row's error,
and from there the ledger's ``error`` column, the asset's metadata and checks, the event log
and the logs. So every text that comes from a server (an error body, a batch line's error, the
message of an exception raised while talking to it) passes :class:`Redactor` where the error is
made (the transports, the batch protocols), and nothing downstream needs to know.

It replaces with ``***``:

* every configured API key, wherever it appears (keys shorter than :data:`SHORTEST_SECRET`
  characters are no secret worth the word and would blank out ordinary text);
* whatever follows ``Bearer``, and the value of an ``Authorization``, ``x-api-key`` or
  ``api-key`` header or parameter in the usual spellings (``name: value``, ``"name": "value"``,
  ``name=value``), so a key this process does not know (a proxy's own) goes too.

Example::

    >>> redact = Redactor(["sk-live-0123456789"])
    >>> redact("bad key sk-live-0123456789 (header Authorization: Bearer abc.def)")
    'bad key *** (header Authorization: Bearer ***)'
    >>> redact('{"x-api-key": "k-9876"}')
    '{"x-api-key": "***"}'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar

from .errors import EndpointError, classify_http_error

MASK = "***"
#: Configured keys shorter than this are not looked for (see the module).
SHORTEST_SECRET = 4

# A header or parameter value ends at white space, a quote, a backslash (a JSON escape) or
# the punctuation that opens or closes it in JSON, a dict's repr, a query string or a text.
_VALUE = r"[^\s\"'\\,;&}\])>(]+"
_BEARER = re.compile(r"(?i)\b(bearer\s+)" + _VALUE)
_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|x-api-key|x-goog-api-key|api[-_]?key)"
    r"(\\?[\"']?\s*[:=]\s*\\?[\"']?)"  # ': ', '": "', '=', with JSON's escaped quotes too
    r"((?:bearer|basic|token)\s+)?" + _VALUE)

E = TypeVar("E", bound=BaseException)


class Redactor:
    """The one redaction step: ``redactor(text)`` is the text with secrets masked."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None] = ()):
        keys = sorted({s for s in secrets if s and len(s) >= SHORTEST_SECRET},
                      key=len, reverse=True)  # a key that contains another is masked whole
        self._secrets = re.compile("|".join(map(re.escape, keys))) if keys else None

    @classmethod
    def of(cls, endpoints: Iterable[Any]) -> Redactor:
        """The redactor of the API keys of ``endpoints`` (``EndpointSpec``s, keys resolved:
        an environment variable's value, as a run reads it)."""
        return cls(getattr(e, "api_key", None) for e in endpoints)

    def __call__(self, text: str) -> str:
        if self._secrets is not None:
            text = self._secrets.sub(MASK, text)
        lowered = text.lower()  # (cheap tests first: most texts name no header)
        if "bearer" in lowered:
            text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
        if "key" in lowered or "authorization" in lowered:
            text = _HEADER.sub(_masked_header, text)
        return text

    def error(self, exc: E) -> E:
        """``exc`` with its message (its first argument, as every error of
        :mod:`.errors` keeps it) redacted: the same object, raised or kept as before."""
        if exc.args and isinstance(exc.args[0], str):
            clean = self(exc.args[0])
            if clean != exc.args[0]:
                exc.args = (clean, *exc.args[1:])
        return exc

    def describe(self, exc: BaseException, limit: int = 300) -> str:
        """``"<type>: <message>"`` of an exception raised while talking to a server (its
        message may quote the reply), redacted and then cut to ``limit`` characters: for a
        log line."""
        return f"{type(exc).__name__}: {self(str(exc))[:limit]}"


def server_error(redact: Redactor, status: int, body: str, *, endpoint: str,
                 retry_after_s: float | None = None, url: str | None = None) -> EndpointError:
    """The typed error of a server's non-200 reply (:func:`.errors.classify_http_error`), its
    body redacted before it is cut to a message (so a key at the cut goes whole) and the
    message once more after (a key the body held JSON-escaped, ``\\u0073k-...``)."""
    return redact.error(classify_http_error(status, redact(body), retry_after_s=retry_after_s,
                                            endpoint=endpoint, url=url))


def _masked_header(match: re.Match[str]) -> str:
    name, separator, scheme = match.group(1), match.group(2), match.group(3) or ""
    return f"{name}{separator}{scheme}{MASK}"


#: Masks the header and ``Bearer`` forms only: for a text where no configured key is known.
FORMS_ONLY = Redactor()

__all__ = ["FORMS_ONLY", "MASK", "Redactor", "server_error"]
