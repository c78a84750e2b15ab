"""One exception class per absl::StatusCode, all subclasses of cubist.Error.

The C++ library reports every failure as an absl::Status; the native layer raises the
class registered here for its code with the message unchanged, so a caller can catch
`cubist.NotFoundError` (no kernel for a problem, artifact missing offline) apart from
`cubist.DataLossError` (hash mismatch) and show the C++ message as is. Argument errors
found in Python (dtype, shape, device) are `cubist.InvalidArgumentError`, which is also
a ValueError.
"""


class Error(Exception):
    """Base class of every error cubist raises. `code` is the absl::StatusCode name."""

    code = "UNKNOWN"

    def __init__(self, message="", report=None):
        super().__init__(message)
        #: For fetch/verify/select failures: the report (as the CLI's --json) that
        #: failed; None otherwise.
        self.report = report


def _make(name, code, *bases):
    return type(name, (Error,) + bases, {"code": code, "__module__": "cubist"})


CancelledError = _make("CancelledError", "CANCELLED")
UnknownError = _make("UnknownError", "UNKNOWN")
InvalidArgumentError = _make("InvalidArgumentError", "INVALID_ARGUMENT", ValueError)
DeadlineExceededError = _make("DeadlineExceededError", "DEADLINE_EXCEEDED", TimeoutError)
NotFoundError = _make("NotFoundError", "NOT_FOUND")
AlreadyExistsError = _make("AlreadyExistsError", "ALREADY_EXISTS")
PermissionDeniedError = _make("PermissionDeniedError", "PERMISSION_DENIED")
ResourceExhaustedError = _make("ResourceExhaustedError", "RESOURCE_EXHAUSTED")
FailedPreconditionError = _make("FailedPreconditionError", "FAILED_PRECONDITION")
AbortedError = _make("AbortedError", "ABORTED")
OutOfRangeError = _make("OutOfRangeError", "OUT_OF_RANGE")
UnimplementedError = _make("UnimplementedError", "UNIMPLEMENTED", NotImplementedError)
InternalError = _make("InternalError", "INTERNAL")
UnavailableError = _make("UnavailableError", "UNAVAILABLE")
DataLossError = _make("DataLossError", "DATA_LOSS")
UnauthenticatedError = _make("UnauthenticatedError", "UNAUTHENTICATED")

#: Indexed by absl::StatusCode's value (0 = OK has no class).
BY_CODE = [
    None, CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
    NotFoundError, AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError,
    FailedPreconditionError, AbortedError, OutOfRangeError, UnimplementedError,
    InternalError, UnavailableError, DataLossError, UnauthenticatedError,
]

__all__ = ["Error"] + [c.__name__ for c in BY_CODE if c is not None]
