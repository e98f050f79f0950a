"""run_autograder's last step: publish the judge's results, or a failing result if the judge died.

    python -I -S publish.py STATUS PRIVATE_RESULTS RESULTS_JSON

Standard library only and nothing of the course (it must work when the engine cannot even be
imported). STATUS is the judge's exit status. The judge's private file is published when the
judge exited 0 and the file is a results object, or when it is the judge's own failing result (0
points, no tests: a refused sandbox, exit status 1); otherwise RESULTS_JSON becomes FAILED. Either
way RESULTS_JSON is replaced, so a results.json a submission planted there never stands. The
exit status and the reason go to stdout (the instructor's log), never to the student: a worker
that kills its judge chooses the signal.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

FAILED = {
    "score": 0.0,
    "output": "The autograder itself failed on this submission, so it was not graded (score 0). Your "
              "instructor has the details.",
    "output_format": "text", "visibility": "visible", "stdout_visibility": "hidden", "tests": [],
    "extra_data": {"status": "failed to grade"},
}


def _valid(result: object) -> bool:
    return (type(result) is dict and type(result.get("score")) in (int, float) and type(result.get("tests")) is list
            and all(type(t) is dict for t in result["tests"]))


def _failing(result: object) -> bool:
    """A results object that gives nothing: the judge's own failing result (it records why: the
    sandbox mode it refused), the only one published when the judge's exit status is not 0."""
    return _valid(result) and result["score"] == 0 and not result["tests"] \
        and type(result.get("extra_data")) is dict and result["extra_data"].get("status") == "failed to grade"


def publish(status: int, private: str, dest: str) -> dict:
    result, why = None, f"the judge exited with status {status}"
    try:
        with open(private, encoding="utf-8") as f:
            result = json.load(f)
        if status == 0:
            why = "" if _valid(result) else "the judge's results are malformed"
        elif status == 1 and _failing(result):  # the judge could not grade and wrote why: 0 points either way
            print(f"autograder failure: the judge exited with status {status} and its own failing result")
            why = ""
    except (OSError, ValueError) as e:
        if status == 0:
            why = f"the judge's results are missing or unreadable ({type(e).__name__})"
    if why:
        print(f"autograder failure: {why}; publishing a failing result")
        result = FAILED
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest) or ".", prefix=".results-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    os.replace(tmp, dest)  # replaces whatever is there (a planted file or link), never follows it
    return result


if __name__ == "__main__":
    try:
        code = int(sys.argv[1])
    except (IndexError, ValueError):
        code = -1
    publish(code, sys.argv[2], sys.argv[3])
