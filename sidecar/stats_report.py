"""Human-readable rendering of the Stats RPC answer (``sts sidecar-stats``)."""

from __future__ import annotations

from sidecar.pb.sts.v1 import inference_pb2 as pb


def _counts(mapping: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(mapping.items()) if v) or "-"


def format_stats(stats: pb.GetStatsResponse) -> str:
    """One block of text: engine line, one row per pool, totals."""
    kv = f"{stats.kv_cache_usage:.0%}" if stats.kv_cache_usage >= 0 else "n/a"
    lines = [
        f"sidecar {stats.sidecar_id}  engine {stats.engine}  model {stats.model}  "
        f"up {stats.uptime_s:.0f} s{'  DRAINING' if stats.draining else ''}",
        f"engine: {stats.output_tokens_per_s:.0f} output tok/s, running {stats.engine_running}, "
        f"waiting {stats.engine_waiting}, KV cache {kv}, "
        f"prefix-cache hit rate {stats.prefix_cache_hit_rate:.1%}",
        f"{'pool':<7}{'queued':>14}{'in flight':>12}{'tokens':>9}{'est wait':>10}"
        f"{'TTFT':>9}{'TPOT':>8}{'on time':>9}  results / shed",
    ]
    for p in stats.pools:
        name = pb.Priority.Name(p.priority).removeprefix("PRIORITY_").lower()
        lines.append(
            f"{name:<7}{f'{p.queued}/{p.max_queued}':>14}{f'{p.in_flight}/{p.max_in_flight}':>12}"
            f"{p.tokens_in_flight:>9}{p.estimated_queue_wait_ms:>8.0f}ms"
            f"{p.ttft_ms:>7.0f}ms{p.tpot_ms:>6.1f}ms{p.met_deadline:>9}  "
            f"{_counts(dict(p.results_by_status))} / {_counts(dict(p.shed_by_reason))}")
    lines.append(f"submitted {stats.submitted}, accepted {stats.accepted}, "
                 f"duplicates {stats.duplicates}; results: {_counts(dict(stats.results_by_status))}")
    if stats.HasField("result_channel"):
        c = stats.result_channel
        up = {1: "", 0: ", DESTINATION UNREACHABLE"}.get(c.up, "")
        lines.append(f"result channel {c.kind}: {c.produced} rows, {c.delivered} delivered, "
                     f"{c.buffered} buffered, {c.delivery_errors} delivery errors{up}")
    if stats.HasField("scale"):
        sc = stats.scale
        capacity = (f"{sc.capacity_tokens_per_s:.0f} tok/s per GPU"
                    if sc.capacity_tokens_per_s > 0 else "capacity not measured yet")
        lines.append(f"scale: demand {sc.demand_tokens_per_s:.0f} tok/s, {capacity}, "
                     f"utilisation {sc.utilisation:.0%} of {sc.gpus} GPU(s); desired GPUs "
                     f"{sc.desired_gpus} ({sc.desired_gpus_exact:.2f} at "
                     f"{sc.target_utilisation:.0%}); refused {sc.refused_share:.0%}, "
                     f"timeouts {sc.timeout_share:.0%} (last 60 s)")
    return "\n".join(lines)
