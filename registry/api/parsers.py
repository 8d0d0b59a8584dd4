"""JSON the API accepts, bounded: a body over DATA_UPLOAD_MAX_MEMORY_SIZE is a 413 and nesting
deeper than MAX_DEPTH a 400 naming the problem, never a RecursionError (a 500) deeper down —
parsing, storing in a JSONField, the audit snapshot or rendering."""

from __future__ import annotations

import codecs
import json

from django.conf import settings
from rest_framework import parsers
from rest_framework.settings import api_settings
from rest_framework.utils.json import strict_constant

from registry.errors import InvalidRequest, PayloadTooLarge

MAX_DEPTH = 64  # metadata, plans and settings are a few levels deep; 64 is generous


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests objects/arrays more than `limit` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def loads(raw: str | bytes, *, what: str = "JSON body", field: str | None = None):
    """json.loads with the API's limits; every refusal is an InvalidRequest naming `what`."""
    try:
        value = json.loads(raw, parse_constant=strict_constant if api_settings.STRICT_JSON
                           else None)
        deep = too_deep(value)
    except RecursionError:
        deep = True
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}", field=field) from None
    if deep:
        raise InvalidRequest(f"{what} is nested too deeply: at most {MAX_DEPTH} levels of "
                             f"objects and arrays", field=field)
    return value


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser with the limits above."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if limit is not None else stream.read()
        if limit is not None and len(raw) > limit:
            raise PayloadTooLarge(f"a JSON body is at most {limit} bytes")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise InvalidRequest(f"JSON body is not valid {encoding}: {exc}") from None
        return loads(text)
