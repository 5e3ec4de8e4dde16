"""L2, context: the knowledge base and retrieval (:mod:`~spark_ext.l2.knowledge_base`,
:mod:`~spark_ext.l2.retrieval`), the feature lookup (:mod:`~spark_ext.l2.features`),
prompts with the stable part first (:mod:`~spark_ext.l2.template`,
:mod:`~spark_ext.l2.prompts`), and L1+L2 fused into one pandas UDF per event batch
(:mod:`~spark_ext.l2.fast_path`). Imports L1, L0 and the base modules only."""
