"""L1, the fast path's first half: tag events as requests (ids, priority, deadlines:
:mod:`~spark_ext.l1.tagging`), embed them (:mod:`~spark_ext.l1.embedding`, shared with
L2) and route them with a small classifier and rules (:mod:`~spark_ext.l1.routing`).
Imports only the package's base modules and L0."""
