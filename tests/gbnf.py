"""A GBNF grammar (the non-recursive subset Kev's grammars use) as one Python regular expression, so
tests can check which texts a grammar admits without llama-server."""

from __future__ import annotations

import re


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j = i + 1
            while expr[j] != '"':
                j += 2 if expr[j] == "\\" else 1
            out.append(("lit", expr[i + 1 : j]))
            i = j + 1
        elif c == "[":
            j = i + 1
            while expr[j] != "]":
                j += 2 if expr[j] == "\\" else 1
            out.append(("cls", expr[i : j + 1]))
            i = j + 1
        elif c == "{":
            j = expr.index("}", i)
            out.append(("rep", expr[i : j + 1]))
            i = j + 1
        elif c in "()|?*+":
            out.append(("op", c))
            i += 1
        else:
            m = re.match(r"[A-Za-z0-9-]+", expr[i:])
            assert m, f"bad GBNF at {expr[i:]!r}"
            out.append(("ref", m.group()))
            i += len(m.group())
    return out


def _unescape(lit: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), lit)


def to_regex(grammar: str, root: str = "root") -> str:
    rules = {}
    for line in grammar.strip().splitlines():
        name, expr = line.split(" ::= ", 1)
        rules[name.strip()] = expr

    def expand(name: str, depth: int = 0) -> str:
        assert depth < 50, "recursive grammar"
        parts = []
        for kind, text in _tokens(rules[name]):
            if kind == "lit":
                parts.append(re.escape(_unescape(text)))
            elif kind == "cls":
                parts.append(text)
            elif kind == "ref":
                parts.append(f"(?:{expand(text, depth + 1)})")
            elif kind == "rep":
                parts.append(text)
            elif text == "(":
                parts.append("(?:")
            else:
                parts.append(text)
        return "".join(parts)

    return expand(root)


def matches(grammar: str, text: str) -> bool:
    return re.fullmatch(to_regex(grammar), text, flags=re.DOTALL) is not None
