"""F5, the scaling-law fitter and the compute box: :mod:`trainledger.journal.scaling` (torch-free, so that replay
refits a ladder's law on a reviewer's machine), under the ladder's name."""

from trainledger.journal.scaling import (  # noqa: F401
    HUBER_DELTA,
    STARTS,
    BoxChoice,
    Candidate,
    ComputeBox,
    ScalingFit,
    fit_scaling_law,
)

__all__ = ["ScalingFit", "fit_scaling_law", "ComputeBox", "BoxChoice", "Candidate", "HUBER_DELTA", "STARTS"]
