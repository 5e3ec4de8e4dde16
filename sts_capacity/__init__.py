"""Capacity planning for sts-spark: traffic profiles and the GPUs they need.

Installed with the sidecar (it needs neither Spark nor the benchmark code): ``sts plan``
sizes a deployment from a traffic profile (``conf/profiles/<name>.yaml`` or a YAML path)
with the seed's formula, and :mod:`sts_capacity.profiles` / :mod:`sts_capacity.distributions`
describe that traffic (lengths, arrivals, priority mix, SLAs), which the benchmarks of a
source checkout replay.

Example:
    >>> from sts_capacity.plan import plan
    >>> from sts_capacity.profiles import load_profile
    >>> plan(load_profile("seed-200qps"), tokens_per_s_per_gpu=3400).gpus
    10
"""
