"""Errors raised by the Spark-side library. Each docstring says whether it is recoverable."""


class StsSparkError(Exception):
    """Base class of spark_ext errors."""


class TemplateOrderError(StsSparkError, ValueError):
    """A prompt template puts per-event content before the stable prefix. Fix the template."""


class PipelineConfigError(StsSparkError, ValueError):
    """The pipeline configuration is invalid. Fix the config."""
