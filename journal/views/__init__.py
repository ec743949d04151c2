"""The journal's views: SQL over verified events (:mod:`.query`) and their Parquet storage with receipts
(:mod:`.parquet`). Stands on the core, the proofs and the audit; nothing below imports it."""
