"""Errors raised by the Spark-side library. Each docstring says whether it is recoverable."""


class StsSparkError(Exception):
    """Base class of spark_ext errors.

    Example:
        >>> issubclass(PipelineConfigError, StsSparkError), issubclass(SparkStartError, StsSparkError)
        (True, True)
    """


class TemplateOrderError(StsSparkError, ValueError):
    """A prompt template puts per-event content before the stable prefix. Fix the template."""


class PipelineConfigError(StsSparkError, ValueError):
    """The pipeline configuration is invalid. Fix the config.

    Example:
        >>> from spark_ext import PipelineConfig
        >>> PipelineConfig.from_dict({"output": {"writer": "paper"}})
        Traceback (most recent call last):
        ...
        spark_ext.exceptions.PipelineConfigError: output.writer: 'paper' is not one of ...
    """


class PipelineFailedError(StsSparkError, RuntimeError):
    """A query or a background part of the pipeline died; the pipeline stopped.

    Unrecoverable for this run: restart the pipeline (it resumes from its checkpoints).

    Example:
        >>> str(PipelineFailedError("query sts-answers failed: OSError: disk full"))
        'query sts-answers failed: OSError: disk full'
    """


class InputFileError(StsSparkError, ValueError):
    """An input file (articles, labelled examples) is missing, empty or has bad lines; the
    message names the file and the line numbers. Nothing was written. Fix the file."""


class EmbeddingModelError(StsSparkError, ValueError):
    """The embedding model folder is missing or not a sentence-transformers model, or the
    requested device is absent. Fix the config (nothing is downloaded from a hub)."""


class KnowledgeBaseError(StsSparkError, RuntimeError):
    """The knowledge base cannot be opened or searched (no collection: run ``sts kb
    build``; or a model or dimension mismatch). Fix the setup; retrying does not help."""


class RoutingModelError(StsSparkError, ValueError):
    """The L1 classifier file is missing, malformed or made for another embedding model.
    Retrain it with ``sts l1 train``."""


class SidecarAuthError(StsSparkError, RuntimeError):
    """The sidecar refused this job's credentials (wrong or missing token, TLS mismatch).
    Unrecoverable: a misconfiguration fails the query instead of turning every request
    into a fallback. Fix ``sidecar.token_*``/``sidecar.tls_*`` in the pipeline config."""


class SidecarLaunchError(StsSparkError, RuntimeError):
    """A sidecar started by a task (``sidecar.launch: lazy``) exited before serving.

    Unrecoverable until fixed: its log (named in the message) says why, e.g. bad
    ``launch_args`` or an endpoint already taken.
    """


class SparkStartError(StsSparkError, RuntimeError):
    """A local Spark session could not start: Java is missing or the JVM exited before
    PySpark could reach it (the message says which). Sometimes transient (memory, a
    port); retry, and check ``java -version`` and ``JAVA_HOME``.

    Example:
        >>> isinstance(SparkStartError("no java on PATH"), RuntimeError)
        True
    """
