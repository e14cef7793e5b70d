"""The one YAML loader for job specs: safe tags only, no anchors or aliases, bounded size and
depth. Pure: no Django.

Why refuse aliases outright rather than cap their expansion: a job spec is a few dozen lines a
person writes; anchors save nothing there, and a 300-byte document of nested aliases expands
to hundreds of megabytes (the "billion laughs"). Depth is capped while the document is
composed, so a deeply nested one is a clear error instead of a RecursionError.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent

MAX_BYTES = 64 * 1024
MAX_DEPTH = 20
QUOTE_LIMIT = 80


class UnsafeYamlError(ValueError):
    """The document is not YAML, or uses what job specs may not (aliases, depth, size)."""


def clip(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` of at most `limit` characters: error messages never echo a whole value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_LONG_QUOTED = re.compile(rf"('[^'\n]{{{QUOTE_LIMIT},}}'|\"[^\"\n]{{{QUOTE_LIMIT},}}\")")


def clip_message(message: str, limit: int = QUOTE_LIMIT, total: int = 400) -> str:
    """Shorten any quoted value in `message` to `limit` characters, and the whole to `total`."""
    message = _LONG_QUOTED.sub(lambda match: match.group(0)[: limit - 1] + "…", message)
    return message if len(message) <= total else message[: total - 1] + "…"


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent) or (
            isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.anchor is not None
        ):
            sign = "*" if isinstance(event, AliasEvent) else "&"
            raise UnsafeYamlError(
                f"YAML anchors and aliases are not allowed in a job spec ({sign}{clip(event.anchor, 40)[1:-1]})"
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise UnsafeYamlError(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(text: str | bytes) -> Any:
    """Parse one YAML (or JSON) document. Raises UnsafeYamlError with a short message."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UnsafeYamlError("not UTF-8 text") from error
    if len(text.encode("utf-8")) > MAX_BYTES:
        raise UnsafeYamlError(f"larger than {MAX_BYTES // 1024} KiB")
    if "\x00" in text:
        raise UnsafeYamlError("contains a NUL character")
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader refuses control characters already here
        return loader.get_single_data()
    except UnsafeYamlError:
        raise
    except yaml.YAMLError as error:
        raise UnsafeYamlError(f"not valid YAML/JSON: {clip_message(str(error))}") from error
    except RecursionError as error:  # belt and braces: the depth cap should stop this first
        raise UnsafeYamlError(f"nested deeper than {MAX_DEPTH} levels") from error
    finally:
        if loader is not None:
            loader.dispose()
