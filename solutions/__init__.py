"""Reference solutions of the six graded parts (the starter is generated from these files)."""
