"""L4, answers: answer rows from results, refusals and lost requests
(:mod:`~spark_ext.l4.answers`), what each arriving row offers
(:mod:`~spark_ext.l4.candidates`, :mod:`~spark_ext.l4.arrivals`), the ledger that gives
each request one answer (:mod:`~spark_ext.l4.ledger`), the micro-batch that writes the
tables (:mod:`~spark_ext.l4.answers_batch`) through a writer
(:mod:`~spark_ext.l4.writers`), output validation (:mod:`~spark_ext.l4.validation`),
the rollout modes (:mod:`~spark_ext.l4.rollout`) and the answers topic
(:mod:`~spark_ext.l4.answers_topic`)."""
