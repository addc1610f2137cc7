"""Which of the source's columns a read carries: all seven, or the ones a user narrowed it to.

PySpark's Python data sources cannot prune columns: Spark converts every column a source emits
into its rows, whatever the query uses. So the source lets the user say which columns a read
has, and emits only those Arrow columns (``tidelog.wire.arrow`` builds nothing else):

- a user-specified schema, ``spark.read.format("tidelog").schema("partition INT, value
  BINARY")``: Spark hands it to ``reader(schema)`` / ``streamReader(schema)``; or
- the option ``columns`` (``"partition,value"``), which the source's ``schema()`` answers with
  those columns (Spark asks ``schema()`` only when the user gave none).

Either way each column must be one of the source's, by its exact name, with the source's type,
nullable (as the source declares them all), at most once, in any order. Anything else is an
:class:`~tidelog.errors.UnknownColumn` naming the column and what was expected, raised when
Spark asks for the reader (at the first action), before any task runs.

Pure: no JVM, no broker; the types are built in Python, as the executors' workers (which have no
JVM) check them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidelog.errors import UnknownColumn
from tidelog.wire.arrow import COLUMNS

SOURCE_TYPES: Final[dict[str, DataType]] = {
    "key": BinaryType(),
    "value": BinaryType(),
    "stream": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "timestamp": TimestampType(),
    "headers": ArrayType(
        StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    ),
}
"""The source's columns and their Spark types (``tidelog.wire.arrow.arrow_schema``'s Arrow
types are their Arrow forms)."""

_DDL: Final = {
    "key": "BINARY",
    "value": "BINARY",
    "stream": "STRING",
    "partition": "INT",
    "offset": "BIGINT",
    "timestamp": "TIMESTAMP",
    "headers": "ARRAY<STRUCT<key: STRING, value: BINARY>>",
}


def ddl(columns: Sequence[str] = COLUMNS) -> str:
    """The schema of ``columns`` as Spark DDL (all of them: the source's schema)."""
    return ", ".join(f"{name} {_DDL[name]}" for name in columns)


def source_schema() -> StructType:
    return StructType([StructField(name, SOURCE_TYPES[name]) for name in COLUMNS])


def columns_of(schema: StructType) -> tuple[str, ...]:
    """The columns a read with ``schema`` (the user's, or the source's own) emits, in order."""
    names = []
    for field in schema.fields:
        expected = SOURCE_TYPES.get(field.name)
        if expected is None:
            near = [c for c in COLUMNS if c.lower() == field.name.lower()]
            hint = f" (the source's is {near[0]!r}: names are exact)" if near else ""
            raise UnknownColumn(
                f"the schema names column {field.name!r}, which the tidelog source does not "
                f"have{hint}; its columns are {ddl()}"
            )
        if field.dataType != expected:
            raise UnknownColumn(
                f"the schema gives column {field.name!r} type {field.dataType.simpleString()}; "
                f"the tidelog source's is {expected.simpleString()}"
            )
        if not field.nullable:
            raise UnknownColumn(
                f"the schema declares column {field.name!r} NOT NULL; the tidelog source's "
                f"columns are nullable: leave NOT NULL out"
            )
        if field.name in names:
            raise UnknownColumn(f"the schema names column {field.name!r} twice")
        names.append(field.name)
    if not names:
        raise UnknownColumn(f"the schema names no column; the source's columns are {ddl()}")
    return tuple(names)
