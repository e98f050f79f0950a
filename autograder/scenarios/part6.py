"""Part 6 has no scenario of its own: its tests record split_kv, attention_partial, combine_partials
and flash_decode with tracing.call, and the judge replays the records (autograder/engine/replay.py)."""
