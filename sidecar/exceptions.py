"""Errors raised by the sidecar. Each docstring says whether it is recoverable."""


class SidecarError(Exception):
    """Base class of sidecar errors."""


class ModelPreparationError(SidecarError):
    """The packaged model could not be found or converted. Unrecoverable for this run."""


class EngineStartError(SidecarError):
    """The engine failed to load its model. Unrecoverable."""


class EngineDeadError(SidecarError):
    """The engine died while serving; every in-flight request ends in ``error``. Unrecoverable."""


class ConfigError(SidecarError, ValueError):
    """A configuration value, flag, file or address is wrong. Unrecoverable for this run;
    the message is one line, ``<what> (<where>)``, printed as ``sts: <message>``."""


class SidecarUnreachableError(SidecarError):
    """A client could not get an answer from the sidecar (not running, wrong address,
    refused credentials). Recoverable: try again once it serves."""
