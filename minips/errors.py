"""Exceptions that mean "the user asked for something that cannot be done".

The CLI prints these as one line (no traceback) and exits non-zero; anything else is a bug
and keeps its traceback.
"""


class MinipsError(Exception):
    """Base class for user-facing errors: the message is the whole explanation."""


class DataError(MinipsError):
    """A dataset is missing, truncated, corrupt or of the wrong shape."""


class ConfigError(MinipsError):
    """An option or model/dataset name is invalid."""


class ShapeError(MinipsError):
    """An array (input batch, parameter, delta) has the wrong shape or dtype."""


class RunDirError(MinipsError):
    """A path given as a run directory is missing, is not one, or holds unreadable logs."""


class MissingExtraError(MinipsError):
    """An optional dependency (an `extras_require` of setup.cfg) is not installed."""


class ProtocolError(MinipsError):
    """A message broke the protocol; `code` names the rule (see docs/protocol.md, "Errors")."""

    def __init__(self, reason: str, code: str = "malformed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
