"""sts-spark Spark-side library (layers L1, L2, L4). Built in a later change."""

__all__: list[str] = []
