"""A JSON schema as a regex: the schemas whose answers a byte DFA can check.

A schema names a set of JSON documents; a regex names a set of strings. For the schemas below
the two meet: the object's keys come in a fixed order, every property is required, and no
whitespace is allowed between tokens (one rule, `WHITESPACE = ""`: compact JSON, what
`json.dumps(value, separators=(",", ":"))` writes). The regex is then built by recursion on
the schema, each part's regex placed inside its parent's.

The regex is not the only way to write the same answers in JSON (`{"a": 1}` and `{"a":1}` are
the same object), so it chooses one spelling: compact, keys in the schema's order, strings with
their characters as they are (not `\\u` escapes, though a string may hold escapes). outlines-core's
`build_regex_from_schema` makes the same choices (with `whitespace_pattern=""`), and
xgrammar's `compile_json_schema` with `any_whitespace=False, separators=(",", ":")`.

Supported (anything else is refused by `check_schema`, by name): `type` string, integer,
number, boolean, null, array (with `items`), object (with `properties`, all `required`,
`additionalProperties` false or absent); `enum` and `const` of any JSON values; `minItems` and
`maxItems`; the annotations `title`, `description`, `$schema`, `examples`. Objects and arrays
may nest to any fixed depth: the schema is finite, so the regex is too. What no regex can say
is a document nested as deeply as it likes (`{"type": "object"}` with no properties: any object,
any depth), or a schema that refers to itself: those need a stack, and xgrammar's grammars.
"""

from __future__ import annotations

import json
import re

WHITESPACE = ""  # the one whitespace rule: none between tokens

# The JSON values' own regexes, from RFC 8259 (sections 6 and 7). A string's character is any
# but `"`, `\\` and the control characters U+0000-U+001F, or an escape; a number has an
# optional minus, no leading zeros, an optional fraction and an optional exponent whose sign is
# optional. (outlines-core 0.2.14 differs in two places: its strings refuse `\\u` escapes and
# U+007F-U+009F, its exponents need a sign. The tests substitute these pieces into its regex.)
STRING = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
INTEGER = r"-?(0|[1-9][0-9]*)"
NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
BOOLEAN = r"(true|false)"
NULL = r"null"
SCALARS = {"string": STRING, "integer": INTEGER, "number": NUMBER, "boolean": BOOLEAN,
           "null": NULL}  # fmt: skip

ANNOTATIONS = {"title", "description", "$schema", "examples"}  # say nothing of valid answers
KEYWORDS = {
    "string": {"type"},
    "integer": {"type"},
    "number": {"type"},
    "boolean": {"type"},
    "null": {"type"},
    "array": {"type", "items", "minItems", "maxItems"},
    "object": {"type", "properties", "required", "additionalProperties"},
}


def check_schema(schema, where: str = "the schema") -> None:
    """Refuse, with a ValueError that names it, anything `schema_to_regex` does not support:
    never a regex that quietly allows answers the schema refuses, or refuses ones it allows."""
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON object (a dict), got {type(schema).__name__}")
    keywords = set(schema) - ANNOTATIONS
    if "enum" in keywords or "const" in keywords:
        values = schema["enum"] if "enum" in schema else [schema.get("const")]
        extra = keywords - {"enum", "const", "type"}
        if extra or {"enum", "const"} <= keywords:
            raise ValueError(f"{where}: with enum or const, only type may be given, got "
                             f"{sorted(keywords)}")  # fmt: skip
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: enum must be a non-empty list, got {values!r}")
        if "type" in schema:
            wrong = [v for v in values if not _has_type(v, schema["type"])]
            if wrong:
                raise ValueError(f"{where}: enum values {wrong!r} are not of type "
                                 f"{schema['type']!r}")  # fmt: skip
        return
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in KEYWORDS:
        raise ValueError(f"{where}: type must be one of {sorted(KEYWORDS)} (or give enum or "
                         f"const), got {kind!r}")  # fmt: skip
    unknown = keywords - KEYWORDS[kind]
    if unknown:
        raise ValueError(f"{where}: the keyword {sorted(unknown)[0]!r} is not supported for "
                         f"type {kind!r} (supported: {sorted(KEYWORDS[kind])})")  # fmt: skip
    if kind == "array":
        if "items" not in schema:
            raise ValueError(f"{where}: an array needs items (a schema for every item): an "
                             "array of any JSON values can nest without end")  # fmt: skip
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        for name, n in (("minItems", low), ("maxItems", high)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
                raise ValueError(f"{where}: {name} must be an integer >= 0, got {n!r}")
        if high is not None and high < low:
            raise ValueError(f"{where}: maxItems ({high}) is below minItems ({low})")
        check_schema(schema["items"], f"{where}.items")
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            raise ValueError(f"{where}: an object needs properties (an object of any keys and "
                             "values can nest without end)")  # fmt: skip
        if schema.get("additionalProperties", False) is not False:
            raise ValueError(f"{where}: additionalProperties must be false (or absent): extra "
                             "keys are not supported")  # fmt: skip
        required = schema.get("required", [])
        if not isinstance(required, list) or set(required) != set(properties):
            missing = sorted(set(properties) - set(required if isinstance(required, list)
                                                   else []))  # fmt: skip
            raise ValueError(f"{where}: every property must be required; not required: "
                             f"{missing}")  # fmt: skip
        for key, sub in properties.items():
            check_schema(sub, f"{where}.properties.{key}")


def _has_type(value, kind) -> bool:
    """Whether a JSON value is of a JSON schema type (true is no integer, 1.0 is one)."""
    kinds = kind if isinstance(kind, list) else [kind]
    checks = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int | float)
        and not isinstance(value, bool)
        and float(value).is_integer(),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }
    return any(checks.get(k, False) for k in kinds)


def literal(value) -> str:
    """The regex of exactly one JSON value, as compact JSON writes it: `"a.b"` matches only
    itself, not `"axb"`."""
    return re.escape(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def schema_to_regex(schema: dict) -> str:
    """The regex whose matches are exactly the compact JSON texts of the documents `schema`
    allows (keys in the schema's order). `schema` has passed `check_schema`."""
    # BEGIN SOLUTION
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        return "(" + "|".join(literal(v) for v in values) + ")"
    kind = schema["type"]
    if kind in SCALARS:
        return f"({SCALARS[kind]})"
    if kind == "array":  # items separated by commas; an empty array unless minItems says not
        item = schema_to_regex(schema["items"])
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return r"\[\]"
        more = f"(,{item}){{{max(low - 1, 0)},{'' if high is None else high - 1}}}"
        return rf"\[({item}{more}){'?' if low == 0 else ''}\]"
    # An object: every property, in the schema's order, its key written as JSON writes it.
    fields = [f"{literal(key)}:{schema_to_regex(sub)}" for key, sub in schema["properties"].items()]
    return r"\{" + ",".join(fields) + r"\}"
    # END SOLUTION
