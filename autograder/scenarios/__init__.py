"""Scenario code that runs INSIDE the worker, next to the student's code.

A scenario is a plain function `def name(student, **kwargs) -> plain data` in partN.py, called
by a test as `student.scenario("partN.name", **kwargs)`. `student.module("kv_cache")` returns the
imported student module. Scenarios may import torch, course and autograder.scenarios.*, nothing
from the judge side: whatever they return is checked in the judge, which recomputes every
expected value itself.
"""
