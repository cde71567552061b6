"""lifecycle layer."""
