# SPDX-License-Identifier: MIT
"""The exceptions: one class per kve_status, each carrying the library's
message and the status's name."""


class KvevictError(Exception):
    """A refusal: `status` is the kve_status name ("KVE_EINVAL"), `code` its
    value, `message` the library's one-line message (kve_last_error), or the
    binding's own for an argument refused before the call."""

    status = "KVE_UNKNOWN"
    code = -1

    def __init__(self, message, status=None, code=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def __str__(self):
        # the message alone: the class (and .status) already say which
        # refusal it is, as a Python exception's text does
        return self.message


class InvalidArgumentError(KvevictError, ValueError):
    """KVE_EINVAL: an argument, spec key or value, position or weight is
    invalid (also raised by the binding for arrays of the wrong dtype, shape,
    layout or length, before the call)."""
    status, code = "KVE_EINVAL", 1


class OutOfMemoryError(KvevictError, MemoryError):
    """KVE_ENOMEM: an allocation failed."""
    status, code = "KVE_ENOMEM", 2


class RangeError(KvevictError, ValueError):
    """KVE_ERANGE: an output buffer is too small (or a weight does not fit
    float32 when a trace is written)."""
    status, code = "KVE_ERANGE", 3


class FormatError(KvevictError, ValueError):
    """KVE_EFORMAT: a file or array is malformed: rows that are not
    distributions, a bad .npy header."""
    status, code = "KVE_EFORMAT", 4


class KvevictIOError(KvevictError, OSError):
    """KVE_EIO: a file could not be opened, read or written (the message
    carries the system's reason)."""
    status, code = "KVE_EIO", 5


class CanceledError(KvevictError):
    """KVE_ECANCELED: a progress callback asked a call to stop."""
    status, code = "KVE_ECANCELED", 6


BY_CODE = {cls.code: cls for cls in (InvalidArgumentError, OutOfMemoryError, RangeError,
                                     FormatError, KvevictIOError, CanceledError)}
