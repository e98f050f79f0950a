"""Instructor-only: hidden tests, batch grading, the sandbox, the Gradescope and nbgrader channels,
the release tool, the mutation catalogue and the red-team corpus. Nothing here ships to students
(instructor/release.py copies only the student folders, and tests/test_release.py proves that
nothing it ships imports this package)."""
