"""Hidden assignment tests (never in the student release): more shapes, seeds and edge cases."""
