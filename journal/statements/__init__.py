"""Signed documents about a run, for whoever receives the model or the figures: the model's release provenance
(:mod:`.release`: OpenSSF model signing, SLSA, DSSE) and the compute statement (:mod:`.compute`). Each is built
from a verified journal and checked offline from its proofs. Stands on the core, the proofs and the audit."""
