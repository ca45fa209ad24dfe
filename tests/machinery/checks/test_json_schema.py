"""The given parts of chapter 9's JSON schemas: `check_schema` refuses, by name, every schema
`schema_to_regex` does not support, and the scalar pieces match what Python's `json` parses."""

from __future__ import annotations

import json
import re

import pytest

from solutions.json_schema import BOOLEAN, INTEGER, NULL, NUMBER, STRING, check_schema

OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

REFUSED = [
    ({"type": "integer", "minimum": 0}, "minimum"),
    ({"type": "string", "pattern": "^a$"}, "pattern"),
    ({"type": "string", "maxLength": 3}, "maxLength"),
    ({"type": "object"}, "properties"),
    ({"type": "array"}, "items"),
    ({**OBJECT, "required": []}, "required"),
    ({**OBJECT, "additionalProperties": True}, "additionalProperties"),
    ({"anyOf": [{"type": "integer"}]}, "type"),
    ({"$ref": "#"}, "type"),
    ({"type": ["integer", "null"]}, "type"),
    ({"type": "strng"}, "type"),
    ({"enum": []}, "enum"),
    ({"type": "string", "enum": ["a", 1]}, "enum"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 2}, "maxItems"),
    ({"type": "object", "properties": {"a": {"type": "date"}}, "required": ["a"]},
     "properties.a"),
]  # fmt: skip


@pytest.mark.parametrize("schema,named", REFUSED, ids=[n for _, n in REFUSED])
def test_check_schema_refuses_what_the_regex_cannot_say_by_name(schema, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        check_schema(schema)


def test_check_schema_takes_the_supported_subset():
    check_schema({"title": "t", "description": "d", **OBJECT, "additionalProperties": False})
    check_schema({"type": "array", "items": OBJECT, "minItems": 1, "maxItems": 4})
    check_schema({"type": "integer", "enum": [1, 2]})
    check_schema({"const": None})


# Texts Python's json parses as one value of each kind, and near-misses it refuses.
SCALAR_TEXTS = {
    STRING: ['""', '"a b"', '"é😀"', r'"\n\t\"\\\/"', r'"\u00e9\uD83D"', '"\x7f\x85"',
             '"a', '"\n"', r'"\x"', r'"\u12"', "'a'"],
    INTEGER: ["0", "-0", "7", "-120", "10000000000000", "01", "+1", "1.0", "-", ""],
    NUMBER: ["0", "-0.5", "2.5e10", "1E+3", "1e3", "6.02e-23", ".5", "1.", "01", "1e", "--1"],
    BOOLEAN: ["true", "false", "True", "tru"],
    NULL: ["null", "None", "nul"],
}  # fmt: skip


def json_kind(text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return type(value)


@pytest.mark.parametrize("piece", list(SCALAR_TEXTS), ids=["string", "integer", "number",
                                                         "boolean", "null"])  # fmt: skip
def test_scalar_pieces_match_what_json_parses(piece):
    kinds = {STRING: {str}, INTEGER: {int}, NUMBER: {int, float}, BOOLEAN: {bool},
             NULL: {type(None)}}[piece]  # fmt: skip
    for text in SCALAR_TEXTS[piece]:
        assert bool(re.fullmatch(piece, text)) == (json_kind(text) in kinds), text
