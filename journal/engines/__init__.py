"""Verification on distributed engines: the project's own verifier run as an engine's tasks, the trust kept in it.

The engine is trusted to schedule and to carry results back, never to verify: every task runs
:func:`trainledger.journal.audit.rundir.verify_rank` on one rank journal under pinned keys, and the driver checks the
cross-rank anchors and the run's identity with :func:`trainledger.journal.audit.rundir.check_run`, the same code
``verify RUN_DIR`` runs. :mod:`.ray` is the Ray adapter; another engine's is the same few lines (docs/fleet.md).
"""
