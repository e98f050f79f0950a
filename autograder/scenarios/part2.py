"""Part 2 has no scenario of its own: its tests record flash_forward with tracing.call and the judge
replays the record (autograder/engine/replay.py); nothing measured here decides a point."""
