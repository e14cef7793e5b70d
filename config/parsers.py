"""Request body parsers with the caps every endpoint shares (DESIGN.md "Errors": nothing a user
sends yields a 500).

A JSON body nested thousands deep makes Python's decoder raise RecursionError, and one that is
merely deep makes every later walk over it (validation, storage, rendering) slow; a NUL in a
string is refused by PostgreSQL's text columns. Both are turned away here, once, as a 400.
"""

import re

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 32


# NUL, and lone UTF-16 surrogates ("\ud800" is valid JSON but no Unicode text: it cannot be
# encoded for the database or a response).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_json_value(value: object, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError if `value` (decoded JSON) nests deeper than `max_depth` or holds a
    character no text column can store (NUL, a lone surrogate)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if UNSTORABLE.search(item):
                raise ValueError("strings may not contain NUL characters or lone surrogates")
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if UNSTORABLE.search(key):
                    raise ValueError("keys may not contain NUL characters or lone surrogates")
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser (strict: no NaN/Infinity) plus the depth and NUL caps."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as error:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from error
        try:
            check_json_value(data, max_depth=settings.GPUBOOK_MAX_JSON_DEPTH)
        except ValueError as error:
            raise ParseError(f"JSON parse error - {error}") from error
        return data

