"""Gradescope channel: `python -m instructor.gradescope build --out ZIP` packs the autograder;
Gradescope's run_autograder calls `python -m instructor.gradescope run`, which grades
/autograder/submission with the same engine and tests as `make grade` (public + hidden) and
writes /autograder/results/results.json. GRADESCOPE_ROOT moves /autograder (for tests)."""
