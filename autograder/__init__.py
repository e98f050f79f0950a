"""The assignment's grader: engine, rubric, tests, scenarios, starter generator (autograder/README.md)."""
