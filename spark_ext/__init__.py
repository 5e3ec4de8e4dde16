"""sts-spark's Spark-side library: layers L0 (sources), L1 and L2 (the fast path: routing,
retrieval, prompts), the hand-off to the sidecar (submit) and L4 (answers), wired by
:class:`StsPipeline`.

Public names, re-exported from their modules. They are loaded on first use, so a Spark
Python worker that imports one module of the package (say the submission's) does not
load the rest (Delta writer, the pipeline) it never runs::

    from spark_ext import PipelineConfig, StsPipeline, local_session

    spark = local_session("sts")
    pipeline = StsPipeline(spark, PipelineConfig.from_yaml("conf/pipeline.yaml"))
    pipeline.start()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar import lazy_exports

#: Public name -> the module it comes from.
_EXPORTS = {
    # From spark_ext.config
    "PipelineConfig": "spark_ext.config",
    "SidecarEndpointConfig": "spark_ext.config",
    "SourceConfig": "spark_ext.config",
    "SOURCE_FORMATS": "spark_ext.config",
    # From spark_ext.api.inference: the DataFrame API inside a user's own query
    "LlmInference": "spark_ext.api.inference",
    "InferenceQueries": "spark_ext.api.inference",
    "DeltaAnswersWriter": "spark_ext.api.inference",
    # From spark_ext.exceptions
    "PipelineConfigError": "spark_ext.exceptions",
    "PipelineFailedError": "spark_ext.exceptions",
    "SparkStartError": "spark_ext.exceptions",
    "StsSparkError": "spark_ext.exceptions",
    # From spark_ext.session
    "local_session": "spark_ext.session",
    # From spark_ext.jvm_packages
    "spark_packages": "spark_ext.jvm_packages",
    # From spark_ext.sources (L0)
    "event_source": "spark_ext.sources.events",
    # From spark_ext.l2 (prompts)
    "PromptTemplate": "spark_ext.l2.template",
    "build_requests": "spark_ext.l2.prompts",
    # From spark_ext.submit
    "submit_requests": "spark_ext.submit.submission",
    # From spark_ext.l4
    "AnswerStore": "spark_ext.l4.answer_store",
    "read_results": "spark_ext.l4.channels",
    # From spark_ext.pipeline
    "StsPipeline": "spark_ext.pipeline.sts_pipeline",
    "run_offline": "spark_ext.pipeline.offline",
}
#: Names whose attribute in their module differs from the public one.
_RENAMED = {"spark_packages": "packages"}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _RENAMED)


if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from spark_ext.config import SOURCE_FORMATS, PipelineConfig, SidecarEndpointConfig, SourceConfig
    from spark_ext.api.inference import DeltaAnswersWriter, InferenceQueries, LlmInference
    from spark_ext.exceptions import (PipelineConfigError, PipelineFailedError, SparkStartError,
                                      StsSparkError)
    from spark_ext.jvm_packages import packages as spark_packages
    from spark_ext.l2.prompts import build_requests
    from spark_ext.l2.template import PromptTemplate
    from spark_ext.l4.answer_store import AnswerStore
    from spark_ext.l4.channels import read_results
    from spark_ext.pipeline.offline import run_offline
    from spark_ext.pipeline.sts_pipeline import StsPipeline
    from spark_ext.session import local_session
    from spark_ext.sources.events import event_source
    from spark_ext.submit.submission import submit_requests
