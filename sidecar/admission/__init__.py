"""Admission: validate -> dedupe -> gate -> validate -> load, one module per step, wired
by :class:`~sidecar.admission.pipeline.Admission` (read its module first)."""

# From sidecar.admission.dedupe
from sidecar.admission.dedupe import DedupeWindow

# From sidecar.admission.gate
from sidecar.admission.gate import Gate, GateState

# From sidecar.admission.load
from sidecar.admission.load import LoadCheck

# From sidecar.admission.pipeline
from sidecar.admission.pipeline import Admission, Decisions

# From sidecar.acks (below admission: the load model and tracing use them too)
from sidecar.acks import Ack, Refusal

# From sidecar.admission.validate
from sidecar.admission.validate import check_prompt_tokens, check_request_id, check_static

__all__ = ["Ack", "Admission", "Decisions", "DedupeWindow", "Gate", "GateState", "LoadCheck",
           "Refusal",
           "check_prompt_tokens", "check_request_id", "check_static"]
