"""Errors raised by the sidecar. Each docstring says whether it is recoverable."""


class SidecarError(Exception):
    """Base class of sidecar errors."""


class ModelPreparationError(SidecarError):
    """The packaged model could not be found or converted. Unrecoverable for this run."""


class EngineStartError(SidecarError):
    """The engine failed to load its model. Unrecoverable."""


class EngineDeadError(SidecarError):
    """The engine died while serving; every in-flight request ends in ``error``. Unrecoverable."""
