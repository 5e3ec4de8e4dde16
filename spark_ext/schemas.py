"""Spark schemas derived from the Arrow schemas they mirror (declared once, in Arrow)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

_ARROW_TO_SPARK: dict[pa.DataType, DataType] = {
    pa.string(): StringType(), pa.int32(): IntegerType(), pa.int64(): LongType(),
    pa.float64(): DoubleType(), pa.bool_(): BooleanType(),
}


def spark_type(t: pa.DataType) -> DataType:
    """The Spark type of a primitive Arrow type or a map of primitives."""
    if pa.types.is_map(t):
        return MapType(spark_type(t.key_type), spark_type(t.item_type), True)
    return _ARROW_TO_SPARK[t]


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark schema of an Arrow schema of primitive (or map) columns, all nullable.

    Example:
        >>> spark_schema(pa.schema([("id", pa.string()), ("n", pa.int64())])).simpleString()
        'struct<id:string,n:bigint>'
    """
    return StructType([StructField(f.name, spark_type(f.type), True) for f in schema])
