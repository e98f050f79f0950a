# nbgrader course directory of the FlashAttention assignment. Run nbgrader from this folder with
# the repository on PYTHONPATH (the Makefile exports it), e.g.
#   nbgrader generate_assignment flashattention      # release/ from source/ (solutions cleared)
#   nbgrader autograde flashattention                # grade submitted/*/flashattention/
#   nbgrader export; nbgrader generate_feedback flashattention
# source/flashattention/flashattention.ipynb is GENERATED: python -m instructor.make_notebook
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    import instructor.nbgrader_channel  # noqa: F401
except ImportError:  # run from this folder without PYTHONPATH: the repository is two levels up
    sys.path.insert(0, os.path.dirname(os.path.dirname(_here)))

from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern,  # noqa: E402
                                    LimitOutput, SaveAutoGrades)

from instructor.nbgrader_channel import EngineGrade  # noqa: E402

c = get_config()  # noqa: F821 -- provided by nbgrader's config loader

c.CourseDirectory.course_id = "flashattention"
c.CourseDirectory.root = _here
c.CourseDirectory.db_assignments = [dict(name="flashattention")]

# The same stub as starter/ (instructor/make_starter.py): a region becomes `raise NotImplementedError`.
c.ClearSolutions.code_stub = dict(python="raise NotImplementedError")

# Points come from the grading engine, not from running the notebook: EngineGrade replaces Execute.
c.Autograde.autograde_preprocessors = [
    EngineGrade,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
c.EngineGrade.test_sets = ["public", "hidden"]
