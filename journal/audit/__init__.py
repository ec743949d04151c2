"""journal/audit."""
