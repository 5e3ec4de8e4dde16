"""sts-spark's Spark-side library: non-blocking LLM inference inside a user's own Spark
query (:class:`LlmInference`: requests, fire-and-forget submission, one answer per
request as a streaming DataFrame), and :class:`StsPipeline`, a preset built on it (a
source, L1/L2, the tables) configured by one YAML file.

Public names, re-exported from their modules. They are loaded on first use, so a Spark
Python worker that imports one module of the package (say the submission's) does not
load the rest (Delta writer, the pipeline) it never runs::

    from spark_ext import LlmInference

    llm = LlmInference(spark, key="ticket_id", checkpoint_location="/chk/llm",
                       fallback_text="An agent will answer shortly.")
    queries = llm.start(llm.requests(events, template="Triage.\nTicket: {text}"),
                        answers_table="main.support.llm_answers")

Everything else (the layers' modules) is importable from its own module and may change
between releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar import lazy_exports

#: Public name -> the module it comes from.
_EXPORTS = {
    # From spark_ext.api.inference: the DataFrame API inside a user's own query
    "LlmInference": "spark_ext.api.inference",
    "InferenceQueries": "spark_ext.api.inference",
    "DeltaAnswersWriter": "spark_ext.api.inference",
    # From spark_ext.l2.template
    "PromptTemplate": "spark_ext.l2.template",
    # From spark_ext.pipeline.sts_pipeline and spark_ext.config: the YAML preset
    "StsPipeline": "spark_ext.pipeline.sts_pipeline",
    "PipelineConfig": "spark_ext.config",
    # From spark_ext.session and spark_ext.jvm_packages: a session with what it needs
    "local_session": "spark_ext.session",
    "spark_packages": "spark_ext.jvm_packages",
    # From spark_ext.exceptions
    "StsSparkError": "spark_ext.exceptions",
    "PipelineConfigError": "spark_ext.exceptions",
    "PipelineFailedError": "spark_ext.exceptions",
    "SparkStartError": "spark_ext.exceptions",
}
#: Names whose attribute in their module differs from the public one.
_RENAMED = {"spark_packages": "packages"}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _RENAMED)


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from spark_ext.api.inference import DeltaAnswersWriter, InferenceQueries, LlmInference
    from spark_ext.config import PipelineConfig
    from spark_ext.exceptions import (PipelineConfigError, PipelineFailedError, SparkStartError,
                                      StsSparkError)
    from spark_ext.jvm_packages import packages as spark_packages
    from spark_ext.l2.template import PromptTemplate
    from spark_ext.pipeline.sts_pipeline import StsPipeline
    from spark_ext.session import local_session
