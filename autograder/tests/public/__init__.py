"""Public assignment tests (in the student release)."""
