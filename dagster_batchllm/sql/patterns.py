r"""Databricks' patterns in the engines' syntax: Java regexps for RE2 (DuckDB), LIKE for GLOB.

Databricks runs regular expressions with Java's engine, DuckDB with RE2. Most syntax means the
same in both; these functions rewrite what reads the same but matches differently, and raise
``ValueError`` (saying why) for what has no RE2 equivalent:

* ``\s`` is ``[ \t\n\x0B\f\r]`` in Java; RE2's lacks the vertical tab, so it is added.
* ``.`` stops at ``\r``, U+0085, U+2028 and U+2029 in Java, at ``\n`` only in RE2, so it becomes
  a class (unless the ``s`` or ``d`` flag is used, where both agree).
* ``$n`` group references in a replacement are ``\n`` in RE2.
* A named group ``(?<name>...)`` is ``(?P<name>...)`` in RE2.

Left as they are: ``$`` (Java also matches before a final line terminator) and ``\b`` (Java also
counts non-ASCII letters as word characters) differ only at those places.

Refused (RE2 has no equivalent, so DuckDB would reject the pattern with an error of its own, or
read it differently): lookahead and lookbehind ``(?=``, ``(?!``, ``(?<=``, ``(?<!``, atomic groups
``(?>``, backreferences ``\1`` and ``\k<name>``, possessive
quantifiers ``a*+``, the inline flags ``x``, ``u``, ``c`` and ``U`` (``U`` means Unicode classes in
Java but ungreedy in RE2), and the escapes ``\h``, ``\H``, ``\R``, ``\X``, ``\G``, ``\Z``,
``\e``, ``\c``, ``\u``, ``\N``, ``\b{...}`` and Java's ``\p{...}`` classes (``\p{Alpha}``;
RE2 knows only the Unicode ones, ``\p{L}``).

Example::

    >>> print(java_to_re2_pattern(r"[^a-zA-Z\s]"))
    [^a-zA-Z\s\x0B]
    >>> print(java_to_re2_replacement("$1-$2"))
    \1-\2
"""

from __future__ import annotations

import re

_COUNTED = re.compile(r"\{\d+(,\d*)?\}$")
_JAVA_DOT = r"[^\n\r\x{85}\x{2028}\x{2029}]"

# Groups that open with "(?" followed by these have no RE2 equivalent.
_GROUPS = {
    "=": "lookahead (?=...)", "!": "negative lookahead (?!...)",
    "<=": "lookbehind (?<=...)", "<!": "negative lookbehind (?<!...)",
    ">": "an atomic group (?>...)",
}
# Inline flags Java has and RE2 lacks or reads differently.
_FLAGS = {
    "x": "the comments flag (?x)", "u": "the Unicode-case flag (?u)",
    "c": "the canonical-equivalence flag (?c)",
    "U": "the flag (?U) (Unicode classes in Java, ungreedy matching in RE2)",
}
# Escapes Java reads and RE2 rejects (outside or inside a class alike).
_ESCAPES = {
    "h": r"\h (horizontal whitespace)", "H": r"\H", "R": r"\R (any line break)",
    "X": r"\X (a grapheme cluster)", "G": r"\G (the end of the previous match)",
    "Z": r"\Z (the end before a final line terminator)", "e": r"\e (write \x1B)",
    "c": r"\c (control characters; write \x01 and so on)",
    "u": r"\u (Unicode escapes; write \x{00E9})", "N": r"\N{name}",
    "k": r"a backreference \k<name>",
}
_JAVA_CLASSES = frozenset((
    "Lower", "Upper", "ASCII", "Alpha", "Digit", "Alnum", "Punct", "Graph", "Print", "Blank",
    "Cntrl", "XDigit", "Space"))


def java_to_re2_pattern(pattern: str) -> str:
    r"""A Java (Databricks) regular expression as an RE2 (DuckDB) one that matches the same.

    >>> print(java_to_re2_pattern(r"Agent:.*\S"))
    Agent:[^\n\r\x{85}\x{2028}\x{2029}]*[^\s\x0B]
    >>> print(java_to_re2_pattern(r"(?s)a.b"))
    (?s)a.b
    """
    # The s (DOTALL) and d (UNIX_LINES) flags make Java's dot what RE2's already is.
    keep_dot = any(flag in _inline_flags(pattern) for flag in "sd")
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 == len(pattern):
                raise ValueError("the pattern ends with a lone backslash")
            nxt = pattern[i + 1]
            if nxt == "Q":  # \Q...\E quotes literally in both engines: copy it as it is
                end = pattern.find("\\E", i + 2)
                end = len(pattern) if end < 0 else end + 2
                out.append(pattern[i:end])
                i = end
                continue
            if nxt == "s":
                out.append(r"\s\x0B" if in_class else r"[\s\x0B]")
            elif nxt == "S":
                if in_class:
                    raise ValueError(r"\S inside a character class has no RE2 equivalent "
                                     r"(Java's \s includes the vertical tab, RE2's does not)")
                out.append(r"[^\s\x0B]")
            elif nxt == "v":
                raise ValueError(r"\v means any vertical whitespace in Java but only the "
                                 "vertical tab in RE2")
            elif nxt in _ESCAPES:
                raise ValueError(f"{_ESCAPES[nxt]} has no RE2 equivalent")
            elif nxt in "123456789":
                raise ValueError(f"a backreference (\\{nxt}) has no RE2 equivalent")
            elif nxt == "b" and pattern[i + 2:i + 3] == "{":
                raise ValueError(r"a \b{...} boundary has no RE2 equivalent")
            elif nxt in "pP" and _java_class(pattern, i + 2):
                raise ValueError(f"Java's class {_java_class(pattern, i + 2)} has no RE2 "
                                 r"equivalent (RE2 knows Unicode classes such as \p{L})")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" or pattern.startswith("&&", i):
                raise ValueError("nested classes and class intersections ([a[b]], [a&&b]) "
                                 "have no RE2 equivalent")
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            # A ']' right after '[' or '[^' is a literal in both engines, not the end.
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            if pattern[j:j + 1] == "]":
                out.append(pattern[i:j + 1])
                i = j + 1
                continue
        elif c == "." and not keep_dot:
            out.append(_JAVA_DOT)
            i += 1
            continue
        elif c == "(" and pattern.startswith("?", i + 1):
            if pattern.startswith("?<", i + 1) and not pattern.startswith(("?<=", "?<!"), i + 1):
                out.append("(?P<")  # a named group: RE2 spells it (?P<name>...)
                i += 3
                continue
            _check_group(pattern, i + 2)
        elif pattern.startswith("+", i + 1) and (c in "*+?" or _ends_counted(pattern, i)):
            raise ValueError(f"a possessive quantifier ({c}+) has no RE2 equivalent")
        out.append(c)
        i += 1
    if in_class:
        raise ValueError("a character class is not closed")
    return "".join(out)


def _check_group(pattern: str, start: int) -> None:
    """Raise for a ``(?`` group RE2 cannot read; ``start`` is the index after ``(?``."""
    for opener, construct in _GROUPS.items():
        if pattern.startswith(opener, start):
            raise ValueError(f"{construct} has no RE2 equivalent")
    j = start
    while j < len(pattern) and (pattern[j].isalpha() or pattern[j] == "-"):
        if pattern[j] in _FLAGS:
            raise ValueError(f"{_FLAGS[pattern[j]]} has no RE2 equivalent")
        j += 1


def _ends_counted(pattern: str, i: int) -> bool:
    """Whether ``pattern[i]`` is the ``}`` that closes a ``{n}``, ``{n,}`` or ``{n,m}``."""
    return pattern[i] == "}" and _COUNTED.search(pattern, 0, i + 1) is not None


def _java_class(pattern: str, start: int) -> str | None:
    r"""The Java-only class name of a ``\p{...}`` at ``start`` (after ``\p``), or None."""
    if not pattern.startswith("{", start):
        return None
    end = pattern.find("}", start)
    name = pattern[start + 1:end] if end > 0 else ""
    if name.startswith(("java", "Is")) or name in _JAVA_CLASSES:
        return "\\p{" + name + "}"
    return None


def _inline_flags(pattern: str) -> str:
    """Letters of every inline flag group, ``(?im)`` or ``(?i-s:...)``."""
    letters = []
    start = pattern.find("(?")
    while start >= 0:
        j = start + 2
        while j < len(pattern) and (pattern[j].isalpha() or pattern[j] == "-"):
            letters.append(pattern[j])
            j += 1
        start = pattern.find("(?", j)
    return "".join(letters)


def java_to_re2_replacement(replacement: str) -> str:
    r"""A Java (Databricks) regexp replacement in RE2's (DuckDB's) syntax.

    Java reads ``$n`` as group n and ``\x`` as the character x; RE2 reads ``\n`` as group n,
    ``\\`` as a backslash and ``$`` as itself.

    >>> print(java_to_re2_replacement(r"$1 costs \$5 \\ more"))
    \1 costs $5 \\ more
    """
    out, i = [], 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\":
            if i + 1 == len(replacement):
                raise ValueError("the replacement ends with a lone backslash "
                                 "(Databricks rejects it)")
            nxt = replacement[i + 1]
            out.append("\\\\" if nxt == "\\" else nxt)
            i += 2
        elif c == "$":
            group = replacement[i + 1:i + 2]
            if group == "{":
                raise ValueError("named group references (${name}) have no DuckDB equivalent")
            if not group.isdigit():
                raise ValueError("'$' must be followed by a group number (write \\$ for a "
                                 "dollar sign; Databricks rejects a bare '$')")
            if replacement[i + 2:i + 3].isdigit():
                raise ValueError("group references above $9 have no DuckDB equivalent")
            out.append("\\" + group)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def like_to_glob(pattern: str, escape: str = "\\") -> str:
    r"""A Databricks LIKE pattern as a SQLite GLOB pattern (case-sensitive, as Databricks').

    >>> like_to_glob(r"%50\% off_")
    '*50% off?'
    >>> like_to_glob("[a]*")
    '[[]a][*]'
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            if i + 1 == len(pattern) or pattern[i + 1] not in ("%", "_", escape):
                raise ValueError(f"the escape character {escape!r} must precede %, _ or "
                                 "itself (Databricks rejects anything else)")
            out.append(_glob_literal(pattern[i + 1]))
            i += 2
            continue
        out.append("*" if c == "%" else "?" if c == "_" else _glob_literal(c))
        i += 1
    return "".join(out)


def _glob_literal(c: str) -> str:
    return f"[{c}]" if c in "*?[" else c
