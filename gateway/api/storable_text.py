"""Text the stores cannot hold is refused at the edge: U+0000 (PostgreSQL text) and unpaired surrogates (UTF-8).

Neither is needed by any id, name or reason. Let through, they were stored by SQLite but failed PostgreSQL
with a bare 500 (NUL), or failed the ledger's RFC 8785 encoding or the database driver, some after the
decision was already ledgered (unpaired surrogates, which JSON can spell as a `\\ud800` escape).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import Request

from gateway.errors import Invalid


async def refuse_unstorable_text(request: Request) -> None:
    """Check the path parameters, the query and a JSON body, before the route decides anything. Raises Invalid."""
    for name, value in request.path_params.items():
        _check(f"path parameter {name}", str(value))
    for name, value in request.query_params.multi_items():
        _check("a query parameter name", name)
        _check(f"query parameter {name}", value)
    body = await request.body()
    # In valid JSON a NUL can only be spelled \u0000 and an unpaired surrogate \udXXX or as the raw bytes
    # ED A0-BF (which the parser lets through): a body with neither needs no second parse, and most have neither.
    if b"\\u" not in body and b"\xed" not in body:
        return
    try:
        document = json.loads(body)  # as Starlette reads it, so the same strings are checked
    except ValueError:
        return  # not JSON: the route's own validation answers
    for where, text in _texts(document, "the body"):
        _check(where, text)


def _texts(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(where, text) for every string in a JSON document, object keys before what they hold."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _texts(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield f"a key of {where}", key
            yield from _texts(item, f"{where}.{key}" if where != "the body" else f"field {key}")


def _check(where: str, text: str) -> None:
    if "\x00" in text:
        raise Invalid(f"{where} contains the NUL character (U+0000), which no text field may hold")
    try:
        text.encode()
    except UnicodeEncodeError as e:
        raise Invalid(f"{where} contains an unpaired surrogate (U+{ord(text[e.start]):04X}), which is not text") from e
