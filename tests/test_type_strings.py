"""Databricks type strings (returnType, responseFormat, from_json schemas) as parse_type reads them:
sqlglot's Databricks dialect parses them, and parse_type keeps to Databricks' own grammar where
sqlglot reads more (other dialects' spellings, constraints, casts). Each case that sqlglot and the
hand-written parser it replaced read differently is listed here, with the reading kept."""

from __future__ import annotations

import pytest

from dagster_batchllm.ai_functions.types import Field, SQLType, parse_type
from dagster_batchllm.core.errors import InferenceConfigError

INT, STRING = SQLType("INT"), SQLType("STRING")


@pytest.mark.parametrize("text, ddl, duckdb", [
    ("STRUCT<risk: STRING, score: INT NOT NULL>", "STRUCT<risk: STRING, score: INT NOT NULL>",
     'STRUCT("risk" VARCHAR, "score" INTEGER)'),
    ("struct<a:int, b : array<map<string,double>>>",
     "STRUCT<a: INT, b: ARRAY<MAP<STRING, DOUBLE>>>",
     'STRUCT("a" INTEGER, "b" MAP(VARCHAR, DOUBLE)[])'),
    ("a STRING, b: BIGINT COMMENT 'why'", "STRUCT<a: STRING, b: BIGINT>",
     'STRUCT("a" VARCHAR, "b" BIGINT)'),
    ("`my field` INT", "STRUCT<`my field`: INT>", 'STRUCT("my field" INTEGER)'),
    ("STRUCT<`a``b`: INT>", "STRUCT<`a``b`: INT>", 'STRUCT("a`b" INTEGER)'),
    ("date DATE, time STRING, string STRING", "STRUCT<date: DATE, time: STRING, string: STRING>",
     'STRUCT("date" DATE, "time" VARCHAR, "string" VARCHAR)'),
    ("DECIMAL", "DECIMAL(10,0)", "DECIMAL(10,0)"),
    ("NUMERIC(5, 1)", "DECIMAL(5,1)", "DECIMAL(5,1)"),
    ("DEC(38,38)", "DECIMAL(38,38)", "DECIMAL(38,38)"),
    ("VARCHAR(10)", "STRING", "VARCHAR"),
    ("INT(3)", "INT", "INTEGER"),
    ("LONG", "BIGINT", "BIGINT"),
    ("TIMESTAMP_NTZ", "TIMESTAMP", "TIMESTAMP"),
    ("VARIANT", "JSON", "JSON"),
    ("MAP<CHAR(2), ARRAY<BOOLEAN>>", "MAP<STRING, ARRAY<BOOLEAN>>", "MAP(VARCHAR, BOOLEAN[])"),
    ("STRUCT<from: INT, order: STRING, null: INT, comment: STRING>",
     "STRUCT<from: INT, order: STRING, null: INT, comment: STRING>",
     'STRUCT("from" INTEGER, "order" VARCHAR, "null" INTEGER, "comment" VARCHAR)'),
])
def test_a_type_string_reads_as_databricks_reads_it(text, ddl, duckdb):
    parsed = parse_type(text)
    assert parsed.ddl() == ddl
    assert parsed.duckdb_type() == duckdb


def test_nullability_and_nesting_are_kept():
    parsed = parse_type("STRUCT<a: ARRAY<STRING> NOT NULL COMMENT 'tags', b: MAP<STRING, INT>>")
    assert parsed == SQLType("STRUCT", (
        Field("a", SQLType("ARRAY", (STRING,)), nullable=False),
        Field("b", SQLType("MAP", (STRING, INT)))))


@pytest.mark.parametrize("text, message", [
    # Misspelt or unsupported types are named where they stand.
    ("INTEGRAL", r"unknown type 'INTEGRAL' at position 1 of 'INTEGRAL'"),
    ("STRUCT<a: INT, b: STRNG NOT NULL>", r"unknown type 'STRNG' at position 19 "),
    ("MAP<STRING, FOO>", r"unknown type 'FOO' at position 13 "),
    ("BINARY", r"unknown type 'BINARY'"),
    ("STRUCT<a:>", r"unknown type '>' at position 10 "),
    ("STRUCT<a: ARRAY<INT>", r"expected ',' or '>' but found the end at position 21 "),
    ("DECIMAL(10", r"expected ',' or '\)' but found the end at position 11 "),
    ("STRUCT<a: INT> foo", r"unknown type 'foo' at position 16 "),
    ("STRUCT<a: INT>>", r"unexpected '>' at position 15 "),
    ("STRUCT<a INT b INT>", r"expected '>' but found 'b' at position 14 "),
    ("STRUCT<a: INT, a: STRING>", r"field 'a' appears twice in "),
    ("MAP<INT, STRING>", r"MAP keys must be STRING \(JSON object keys are text\)"),
    ("DECIMAL(40,2)", r"DECIMAL\(40,2\) is out of range"),
    ("DECIMAL(5,6)", r"DECIMAL\(5,6\) is out of range"),
    ("STRUCT<>", r"a STRUCT needs at least one field at position 7 "),
    ("ARRAY<>", r"ARRAY takes one element type, as in ARRAY<STRING> at position 6 "),
    ("STRUCT<`a: INT>", r"a quote or comment is not closed"),
    # sqlglot reads these (other dialects' spellings and syntax); Databricks refuses them, so a
    # query that runs here would fail there.
    ("NUMBER", r"unknown type 'NUMBER' at position 1 of 'NUMBER'"),
    ("ARRAY<NUMBER>", r"unknown type 'NUMBER' at position 7 "),
    ("DOUBLE PRECISION", r"unexpected 'DOUBLE PRECISION'"),
    ("TIMESTAMP WITH TIME ZONE", r"unknown type 'ZONE'"),
    ("INT[]", r"unexpected '\['"),
    ("INT;", r"unexpected ';'"),
    ("STRUCT<a: INT DEFAULT 3>", r"unknown type 'DEFAULT'"),
    ("STRUCT<a: INT NULL>", r"field 'a' takes only NOT NULL and COMMENT after its type"),
    # sqlglot reads these as types with missing or extra parts, or as something else.
    ("ARRAY", r"ARRAY takes one element type"),
    ("ARRAY<INT, INT>", r"ARRAY takes one element type"),
    ("MAP<STRING>", r"MAP takes a key and a value type"),
    ("STRUCT", r"a STRUCT needs at least one field"),
    ("STRUCT<STRUCT<a: INT>>", r"expected a field name before 'STRUCT<a: INT>'"),
    ("NULL", r"unknown type 'NULL'"),
    ("ARRAY<INT>(3)", r"unexpected text after the type"),
    ("DECIMAL(10.5)", r"DECIMAL's precision and scale are whole numbers"),
    ("-- only a comment", r"expected a type but found only a comment"),
])
def test_a_bad_type_string_is_refused_naming_the_problem(text, message):
    with pytest.raises(InferenceConfigError, match=message) as refused:
        parse_type(text, "responseFormat")
    assert str(refused.value).startswith("argument 'responseFormat': ")
    assert repr(text) in str(refused.value)
    assert "Write a Databricks type such as 'STRING'" in str(refused.value)


@pytest.mark.parametrize("text", ["", "   ", None, 3])
def test_a_missing_type_string_is_refused(text):
    with pytest.raises(InferenceConfigError, match="argument 'returnType' must be a non-empty"):
        parse_type(text)


@pytest.mark.parametrize("text, ddl", [
    # Databricks reads these too: SQL comments, a double-quoted string, digits first in a name.
    ("STRUCT<a: INT /* score */> -- the reply", "STRUCT<a: INT>"),
    ('STRUCT<a: INT COMMENT "why">', "STRUCT<a: INT>"),
    ("STRUCT<1a: INT>", "STRUCT<`1a`: INT>"),
    # Databricks refuses these; sqlglot reads each as the type it plainly means, so a query
    # that runs here fails there at worst, never with another type.
    ("STRUCT<a: INT COMMENT 'x' NOT NULL>", "STRUCT<a: INT NOT NULL>"),
    ("STRUCT<a: INT NOT NULL NOT NULL>", "STRUCT<a: INT NOT NULL>"),
    ("STRUCT<a: INT COMMENT 'x' COMMENT 'y'>", "STRUCT<a: INT>"),
    ("ARRAY(INT)", "ARRAY<INT>"),
    ("STRUCT(a INT)", "STRUCT<a: INT>"),
    ("DECIMAL()", "DECIMAL(10,0)"),
    ("a: INT,, b: INT", "STRUCT<a: INT, b: INT>"),
    ('STRUCT<"a": INT>', "STRUCT<a: INT>"),
    ("STRUCT<é: INT>", "STRUCT<`é`: INT>"),
])
def test_what_the_hand_written_parser_refused_and_sqlglot_reads(text, ddl):
    assert parse_type(text).ddl() == ddl


@pytest.mark.parametrize("text, quoted", [
    ("STRUCT<select: INT>", "STRUCT<`select`: INT>"),
    ("not INT", "`not` INT"),
])
def test_a_field_named_select_or_not_needs_backticks(text, quoted):
    """sqlglot reads SELECT and NOT as keywords wherever they stand (Databricks does not); the
    hand-written parser read them as names. Backticks name any field."""
    with pytest.raises(InferenceConfigError, match="expected '>' but found"):
        parse_type(text)
    assert [f.name for f in parse_type(quoted).args] == [quoted.split("`")[1]]
