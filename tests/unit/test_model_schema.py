"""Schemas: the three spellings, the type mapping, and refusal of bad or hostile definitions."""

from __future__ import annotations

import contextlib
import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.errors import SchemaError
from peer.model.schema import (
    TYPES,
    Field,
    Schema,
    parse_schema,
    spark_ddl,
    to_arrow_schema,
)

# Verbatim from the Medusa paper's appendix (section 6.1).
MEDUSA_SCHEMA_XML = (
    '<schema name="medusa://nms.lcs.mit.edu/locator/person">\n'
    ' <field name="person_name" type="string" size="32"/>\n'
    ' <field name="person_id" type="int"/>\n'
    "</schema>\n"
)
PERSON = Schema(
    "medusa://nms.lcs.mit.edu/locator/person",
    (Field("person_name", "string", 32), Field("person_id", "int")),
)
PERSON_DICT = {
    "name": "medusa://nms.lcs.mit.edu/locator/person",
    "fields": [
        {"name": "person_name", "type": "string", "size": 32},
        {"name": "person_id", "type": "int"},
    ],
}


def test_medusa_xml_json_and_dict_are_equal() -> None:
    assert parse_schema(MEDUSA_SCHEMA_XML) == PERSON
    assert parse_schema(MEDUSA_SCHEMA_XML.encode()) == PERSON
    assert parse_schema(json.dumps(PERSON_DICT)) == PERSON
    assert parse_schema(PERSON_DICT) == PERSON


def test_to_dict_round_trips() -> None:
    assert PERSON.to_dict() == PERSON_DICT
    assert parse_schema(PERSON.to_dict()) == PERSON
    assert parse_schema(json.dumps(PERSON.to_dict())) == PERSON


def test_names_field_and_renamed() -> None:
    assert PERSON.names == ("person_name", "person_id")
    assert PERSON.field("person_id") == Field("person_id", "int")
    assert PERSON.renamed("people").fields == PERSON.fields
    assert PERSON.renamed("people").name == "people"


def test_missing_field_names_schema_and_field() -> None:
    with pytest.raises(SchemaError) as info:
        PERSON.field("persn_id")
    assert "medusa://nms.lcs.mit.edu/locator/person" in info.value.message
    assert "persn_id" in info.value.message
    assert info.value.details == {"schema": PERSON.name, "field": "persn_id"}


@pytest.mark.parametrize(
    ("spelled", "type_"),
    [
        ("INT", "int"),
        ("integer", "int"),
        ("bigint", "long"),
        ("Long", "long"),
        ("float", "double"),
        ("DOUBLE", "double"),
        ("boolean", "bool"),
        ("varchar", "string"),
        ("text", "string"),
        ("TimeStamp", "timestamp"),
    ],
)
def test_type_aliases(spelled: str, type_: str) -> None:
    schema = parse_schema({"name": "s", "fields": [{"name": "a", "type": spelled}]})
    assert schema.fields[0].type == type_


def test_size_kept_for_strings_only() -> None:
    xml = (
        '<schema name="s"><field name="a" type="int" size="4"/>'
        '<field name="b" type="string" size="8"/></schema>'
    )
    assert parse_schema(xml).fields == (Field("a", "int"), Field("b", "string", 8))


def test_arrow_and_spark_types() -> None:
    schema = Schema("s", tuple(Field(t[0] + "_", t) for t in TYPES))
    arrow = to_arrow_schema(schema)
    assert [f.type for f in arrow] == [
        pa.int32(),
        pa.int64(),
        pa.float64(),
        pa.bool_(),
        pa.string(),
        pa.timestamp("us", tz="UTC"),
    ]
    assert not any(f.nullable for f in arrow)
    assert spark_ddl(schema) == (
        "`i_` INT, `l_` BIGINT, `d_` DOUBLE, `b_` BOOLEAN, `s_` STRING, `t_` TIMESTAMP"
    )


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ({"name": "s", "fields": []}, "no fields"),
        (
            {"name": "s", "fields": [{"name": "a", "type": "int"}, {"name": "A", "type": "int"}]},
            "repeats",
        ),
        ({"name": "s", "fields": [{"name": "1a", "type": "int"}]}, "not an identifier"),
        ({"name": "s", "fields": [{"name": "a b", "type": "int"}]}, "not an identifier"),
        ({"name": "s", "fields": [{"name": "__seq", "type": "int"}]}, "reserved"),
        ({"name": "s", "fields": [{"name": "a", "type": "decimal"}]}, "unknown type 'decimal'"),
        ({"name": "s", "fields": [{"name": "a", "type": "string", "size": 0}]}, "size"),
        ({"name": "s", "fields": [{"name": "a", "type": "string", "size": "x"}]}, "size"),
        ({"name": "s", "fields": [{"name": "a", "type": "int", "nulls": True}]}, "unknown keys"),
        ({"name": "s", "fields": [{"name": "a", "type": "int", "nullable": "maybe"}]}, "nullable"),
        ({"name": "s", "fields": "a"}, "must be a list"),
        ({"name": "s", "fields": [1]}, "must be an object"),
        ({"name": "s", "fields": [], "extra": 1}, "unknown keys"),
        ({"name": "has space", "fields": [{"name": "a", "type": "int"}]}, "characters"),
        ({"name": "x" * 257, "fields": [{"name": "a", "type": "int"}]}, "longer than 256"),
        ({"name": "", "fields": [{"name": "a", "type": "int"}]}, "non-empty"),
        ({"fields": [{"name": "a", "type": "int"}]}, "non-empty"),
        ("[1, 2]", "must be an object"),
        ("{not json", "neither XML nor valid JSON"),
        ("<schema name='s'><field name='a' type='int'>", "does not parse"),
        ("<stream name='s'/>", "<schema> root"),
        ("<schema name='s'><column name='a' type='int'/></schema>", "unexpected element <column>"),
        (b"\xff\xfe<schema/>", "not UTF-8"),
    ],
)
def test_bad_schemas_are_refused(source: object, fragment: str) -> None:
    with pytest.raises(SchemaError) as info:
        parse_schema(source)  # type: ignore[arg-type]
    assert fragment in info.value.message


def test_error_names_the_field() -> None:
    with pytest.raises(SchemaError) as info:
        parse_schema({"name": "people", "fields": [{"name": "age", "type": "number"}]})
    assert info.value.message.startswith("schema people, field 'age': unknown type 'number'")


def test_billion_laughs_is_refused() -> None:
    bomb = (
        '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
        ' <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n]>\n'
        '<schema name="&lol2;"><field name="a" type="int"/></schema>'
    )
    with pytest.raises(SchemaError, match="ENTITY declarations or a DOCTYPE"):
        parse_schema(bomb)
    with pytest.raises(SchemaError, match="ENTITY declarations or a DOCTYPE"):
        parse_schema(bomb.encode("utf-8"))


def test_oversized_definitions_are_refused() -> None:
    big = '{"name": "s", "fields": [' + " " * (1 << 20) + "]}"
    with pytest.raises(SchemaError, match="larger than"):
        parse_schema(big)
    with pytest.raises(SchemaError, match="larger than"):
        parse_schema(big.encode())


def test_deeply_nested_json_is_refused() -> None:
    with pytest.raises(SchemaError):
        parse_schema("[" * 100_000 + "]" * 100_000)


@settings(deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_schema_error(text: str) -> None:
    with contextlib.suppress(SchemaError):
        parse_schema(text)


@settings(deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_schema_error(data: bytes) -> None:
    with contextlib.suppress(SchemaError):
        parse_schema(data)


_xml_attr = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)


@settings(deadline=None)
@given(
    st.lists(st.tuples(_xml_attr, _xml_attr, st.one_of(st.none(), _xml_attr)), max_size=5),
    _xml_attr,
)
def test_arbitrary_xml_attributes_raise_only_schema_error(
    fields: list[tuple[str, str, str | None]], name: str
) -> None:
    def quote(text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")

    body = "".join(
        f'<field name="{quote(n)}" type="{quote(t)}"'
        + (f' size="{quote(s)}"' if s is not None else "")
        + "/>"
        for n, t, s in fields
    )
    try:
        schema = parse_schema(f'<schema name="{quote(name)}">{body}</schema>')
    except SchemaError:
        return
    assert parse_schema(schema.to_dict()) == schema
