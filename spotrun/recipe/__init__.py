"""The recipe: its schema, its validation and diagnostics (FILE:LINE:COL), YAML positions."""
