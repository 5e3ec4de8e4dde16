"""Spark schemas derived from the Arrow schemas they mirror (declared once, in Arrow)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

_ARROW_TO_SPARK: dict[pa.DataType, DataType] = {
    pa.string(): StringType(), pa.int32(): IntegerType(), pa.int64(): LongType(),
    pa.float64(): DoubleType(), pa.bool_(): BooleanType(),
}


def spark_schema(schema: pa.Schema) -> StructType:
    """Spark schema of an Arrow schema of flat primitive columns (all nullable).

    Example:
        >>> spark_schema(pa.schema([("id", pa.string()), ("n", pa.int64())])).simpleString()
        'struct<id:string,n:bigint>'
    """
    return StructType([StructField(f.name, _ARROW_TO_SPARK[f.type], True) for f in schema])
