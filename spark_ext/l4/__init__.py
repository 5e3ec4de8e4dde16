"""L4, answers: answer rows from results, refusals and lost requests
(:mod:`~spark_ext.l4.answers`), the Delta tables with idempotent appends and backfill
(:mod:`~spark_ext.l4.answer_store`), the safety net (:mod:`~spark_ext.l4.safety_net`),
output validation (:mod:`~spark_ext.l4.validation`) and the rollout modes
(:mod:`~spark_ext.l4.rollout`, :mod:`~spark_ext.l4.shadow`)."""
