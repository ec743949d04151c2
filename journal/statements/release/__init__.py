"""Releasing the model a run made: the folder's model-signing digest (:mod:`.manifest`), its OpenSSF model-signing
signature and SLSA provenance bound to the run's journal (:mod:`.attest`), and their offline check
(:mod:`.verify`). Torch-free; the release key is ECDSA P-256 (:mod:`.keys`). docs/provenance.md."""
