# Your implementation of the six graded parts, one file per part (docs/handout/README.md).
"""Your implementation of the assignment: one file per part; `make grade` grades them."""
