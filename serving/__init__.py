"""A trained run's classifier as files that serve without this project: export.py's pieces."""
