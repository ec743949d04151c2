"""Experiments: the manifest and its findings (torch-free), signed approvals, the preflight gates and the
manifest-driven loop with its stop rules."""
