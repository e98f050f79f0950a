# Generated from solutions/__init__.py by `make starter` (python -m instructor.make_starter): edit there, not here.
"""Reference solutions of the six graded parts (the starter is generated from these files)."""
