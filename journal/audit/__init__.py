"""The audit's generic half: the projection protocol and registry, the fold over a verified journal, and
run-folder verification (cross-rank anchors). Which projections exist is each domain's; the face assembles them."""
