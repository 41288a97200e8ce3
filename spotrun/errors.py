"""One error hierarchy for spotrun; the CLI maps each class to a documented exit code.

Exit codes (also in README and `spotrun --help`):
    0  success
    1  operation failed (any other SpotrunError)
    2  usage error (bad option or argument; Click's own code)
    3  invalid recipe
    4  control plane unavailable (etcd missing, too old, unreachable)
    5  provider error (launch, capacity, quota, unsupported operation)
    6  bootstrap error (SSH, setup script)
    130 interrupted (Ctrl-C)
"""

from __future__ import annotations


class SpotrunError(Exception):
    """Base of every error spotrun reports to the user as one line."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class RecipeError(SpotrunError):
    """A recipe file is missing, unreadable or invalid; `problems` holds one line each."""

    exit_code = 3

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class ControlPlaneError(SpotrunError):
    """etcd is missing, too old, not healthy or unreachable."""

    exit_code = 4


class NotFoundError(SpotrunError):
    """A named cluster, node or key does not exist."""

    exit_code = 1


class ProviderError(SpotrunError):
    """A provider call failed or the provider cannot do what was asked."""

    exit_code = 5


class CapacityError(ProviderError):
    """No capacity or quota for an offer right now; the next candidate may have some."""


class BootstrapError(SpotrunError):
    """A VM could not be reached or set up over SSH."""

    exit_code = 6


class MembershipError(SpotrunError):
    """A compare-and-set on cluster membership lost a race or found bad state."""

    exit_code = 1


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "operation failed",
    2: "usage error (bad option or argument)",
    3: "invalid recipe",
    4: "control plane (etcd) unavailable",
    5: "provider error (launch, capacity, quota, unsupported)",
    6: "bootstrap error (SSH or setup)",
    130: "interrupted",
}
