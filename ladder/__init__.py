"""The pilot ladder: rungs, gates and decisions as a projection. Not built yet (issue 5)."""

__all__: list[str] = []
