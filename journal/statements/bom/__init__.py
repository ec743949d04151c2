"""Documents others read about a model (docs/bom.md): a CycloneDX ML-BOM, an SPDX 3.0.1 AI package, a Hugging Face
model card's metadata and an in-toto evaluation-result statement, each built from a run's verified and replayed
events, every number in it linked to the inclusion proof of the lines it rests on (a proof pack beside the
document), checked offline by ``trainledger verify-bom``. Torch-free."""
