# nbgrader course directory of the FlashAttention assignment. Run nbgrader from this folder with
# the repository on PYTHONPATH (the Makefile exports it), e.g.
#   nbgrader generate_assignment flashattention      # release/ from source/ (solutions cleared)
#   nbgrader autograde flashattention                # grade submitted/*/flashattention/
#   nbgrader export; nbgrader generate_feedback flashattention
# source/flashattention/flashattention.ipynb is GENERATED: python -m instructor.make_notebook
#
# Fail closed: if the grading engine cannot be imported (this folder copied out of the repository
# without PYTHONPATH, a broken install), this file stops nbgrader with exit status 2 and one line
# saying what to do. nbgrader would otherwise log the error, fall back to its default Execute
# preprocessor and run the students' notebooks in a kernel, unsandboxed.
#
# No kernel run can score, even with the preprocessor list replaced on the command line
# (--Autograde.autograde_preprocessors=...): a kernel is no defence, since a student's cell can
# rewrite the later cells before they run. So, outside any kernel: every notebook client gets a
# kernel name that does not exist (any Execute fails before a kernel starts), and nbgrader's
# SaveAutoGrades stores only the points EngineGrade gave a cell in this process (0 otherwise).
# Copying source/flashattention into a course with another config keeps none of this: grade it
# only with this file.
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_repo = os.path.dirname(os.path.dirname(_here))  # where this folder lives inside the repository
if os.path.isfile(os.path.join(_repo, "instructor", "nbgrader_channel.py")) and _repo not in sys.path:
    sys.path.insert(0, _repo)
try:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput, SaveAutoGrades

    from instructor.nbgrader_channel import NO_KERNEL, EngineGrade, accept_bom, guard_save_autogrades
except Exception as _e:  # noqa: BLE001 -- any import failure: refuse, never grade without the engine
    print(f"error: nbgrader_config.py cannot import the course's grading engine ({type(_e).__name__}: {_e}); "
          "run nbgrader with the course repository on PYTHONPATH, e.g. PYTHONPATH=/path/to/repo nbgrader ...",
          file=sys.stderr, flush=True)
    raise SystemExit(2)

c = get_config()  # noqa: F821 -- provided by nbgrader's config loader

c.CourseDirectory.course_id = "flashattention"
c.CourseDirectory.root = _here

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

# Fail closed outside the kernel, whatever the preprocessor list (see the top of this file).
c.NotebookClient.kernel_name = NO_KERNEL
c.ExecutePreprocessor.kernel_name = NO_KERNEL
c.Execute.kernel_name = NO_KERNEL
guard_save_autogrades()
accept_bom()  # a notebook saved with a BOM is graded, not skipped (and exported as 0)
# c.EngineGrade.sandbox = "bubblewrap"      # auto (default), bubblewrap or uid: refused where not available
# c.EngineGrade.allow_weak_sandbox = True   # accept resource limits only where bubblewrap cannot run
