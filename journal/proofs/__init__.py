"""journal/proofs."""
