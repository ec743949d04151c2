"""The health monitor and its folds: anomaly detectors, MFU and compute totals (torch-free), FLOP
accounting, device telemetry."""
