"""mmc.yaml as read: the text (YAML, or JSON, which YAML reads too) parsed with bounds, then
checked against the published JSON Schema (registry/schemas/mmc.schema.json) and the few rules a
schema cannot say. Every refusal names the key's path (`models.fraud.endpoint.weight: must be an
integer from 0 to 100`), so an editor, a CI log and the API say the same thing."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.validators import extend

from registry.errors import InvalidRequest

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "mmc.schema.json"
#: Objects and lists nested deeper than this are refused (the format needs six levels).
MAX_DEPTH = 16
#: At most this many refusals are listed in one answer; the rest are counted.
MAX_ERRORS = 20


@cache
def schema() -> dict:
    """The published JSON Schema, as served at /api/v1/mmc.schema.json."""
    return json.loads(SCHEMA_FILE.read_text())


# A number with a fraction is never an integer here (JSON Schema lets 10.0 be one; the services
# it would reach do not).
_STRICT_TYPES = Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool))
_Validator = extend(Draft202012Validator, type_checker=_STRICT_TYPES)


@cache
def _validator():
    return _Validator(schema())


def text_sha256(text: str) -> str:
    """The file's sha256, as `sha256sum mmc.yaml` prints it (the text is sent as UTF-8)."""
    return hashlib.sha256(text.encode()).hexdigest()


def path_text(parts) -> str:
    """`models.fraud.endpoint.weight`, `webhooks[0].url`: where a key is, as a reader finds it."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the file)"


def refused(errors: list[tuple[str, str]]) -> InvalidRequest:
    """One 400 for every (path, message) found: the message lists them, `field` is the first."""
    shown = [f"{path}: {message}" for path, message in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        shown.append(f"and {len(errors) - MAX_ERRORS} more")
    return InvalidRequest("; ".join(shown), field=errors[0][0], details={"errors": [
        {"path": path, "message": message} for path, message in errors]})


# -- parsing ------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """YAML's safe loader without anchors and aliases (a few lines of them expand into a
    document too large to walk) and without silently kept duplicate keys."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (& and *) are not accepted",
                self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, list | dict):
                continue  # refused below as a key that is not a name
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _json(text: str) -> Any:
    """The document when `text` is JSON (read as JSON: YAML 1.1 would take 1e-05 for a
    string), else None."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None  # a YAML flow mapping, or a mistake the YAML reader words


def parse(text: str) -> dict:
    """The document in `text`: a mapping whose keys are strings (a version number as a key is
    read as its string, "3"). Refused (400, field "file") when it is not."""
    try:
        document = _json(text)
        if document is None:
            document = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except RecursionError:
        raise InvalidRequest(f"the file is nested too deeply: at most {MAX_DEPTH} levels",
                             field="file") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        raise InvalidRequest(f"the file is not valid YAML or JSON: {problem}{at}",
                             field="file") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise InvalidRequest("the file must be a mapping (models:, webhooks:)", field="file")
    return _with_string_keys(document)


def _with_string_keys(document: dict) -> dict:
    """Whole-number keys as strings (YAML reads `3:` as a number); any other key that is not a
    string is refused with its path, as is nesting past MAX_DEPTH. Iterative: no recursion."""
    root: dict = {}
    stack: list[tuple[Any, Any, tuple]] = [(document, root, ())]
    errors = []
    while stack:
        source, target, path = stack.pop()
        if len(path) > MAX_DEPTH:
            errors.append((path_text(path), f"nested too deeply: at most {MAX_DEPTH} levels"))
            continue
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in items:
            if isinstance(source, dict):
                if isinstance(key, int) and not isinstance(key, bool):
                    key = str(key)
                elif not isinstance(key, str):
                    errors.append((path_text(path), f"the key {key!r} is not a name"))
                    continue
            if isinstance(value, dict | list):
                child = {} if isinstance(value, dict) else [None] * len(value)
                stack.append((value, child, (*path, key)))
                value = child
            target[key] = value
    if errors:
        raise refused(errors)
    return root


# -- checking -----------------------------------------------------------------------------------


def _message(error) -> tuple[str, str]:
    """(path, message) for one schema error, worded for the file's reader."""
    path = list(error.absolute_path)
    custom = error.schema.get("errorMessage") if isinstance(error.schema, dict) else None
    if "propertyNames" in error.absolute_schema_path:
        return path_text([*path, error.instance]), custom or error.message
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        hint = f" (known keys: {', '.join(known)})" if known else ""
        return path_text([*path, extra[0]]), f"unknown key{hint}"
    if error.validator == "required":
        missing = next((k for k in error.validator_value if k not in error.instance), "?")
        return path_text([*path, missing]), "is required"
    if error.validator == "dependentRequired":
        for key, needs in error.validator_value.items():
            lacking = [n for n in needs if key in error.instance and n not in error.instance]
            if lacking:
                return path_text([*path, key]), f"needs {' and '.join(lacking)} too"
    return path_text(path), custom or error.message


def check(document: dict) -> None:
    """Refuse (400) a document the schema refuses, or one breaking a rule between keys."""
    errors = sorted({_message(e) for e in _validator().iter_errors(document)})
    if errors:
        raise refused(errors)
    errors = []
    for name, model in (document.get("models") or {}).items():
        errors += _endpoint_rules(f"models.{name}.endpoint", model.get("endpoint"))
    urls: dict[str, int] = {}
    for i, hook in enumerate(document.get("webhooks") or []):
        if hook["url"] in urls:
            errors.append((f"webhooks[{i}].url", f"is also webhooks[{urls[hook['url']]}]'s: a "
                                                 f"webhook is known by its url"))
        urls.setdefault(hook["url"], i)
    if errors:
        raise refused(errors)


def _endpoint_rules(path: str, endpoint: dict | None) -> list[tuple[str, str]]:
    if not endpoint:
        return []
    out = []
    if "blue_green" in endpoint:
        out += [(f"{path}.{key}", "is not used with blue_green (its live slot is the stable)")
                for key in ("stable", "candidate", "weight", "analysis") if key in endpoint]
        bg = endpoint["blue_green"]
        if bg["live"] == bg["idle"]:
            out.append((f"{path}.blue_green.idle", "must differ from live"))
    if "weight" in endpoint and "analysis" in endpoint:
        out.append((f"{path}.weight", "is not used with analysis (the analysis sets the weight)"))
    if "stable" not in endpoint and "blue_green" not in endpoint and "shadow" in endpoint:
        out.append((f"{path}.shadow", "needs stable or blue_green: the routing is declared whole"))
    if endpoint.get("stable", 0) is None:
        out += [(f"{path}.{key}", "needs a stable version (stable is null: nothing is served)")
                for key in ("candidate", "shadow") if key in endpoint]
    steps = (endpoint.get("analysis") or {}).get("steps")
    if steps and steps != sorted(steps):
        out.append((f"{path}.analysis.steps", "must be increasing whole percentages from 1 to "
                                              "100"))
    return out


def read(text: str) -> dict:
    """Parse and check: the document, or a 400 naming every key that is wrong."""
    document = parse(text)
    check(document)
    return document
