"""Batch autograder: intake rules, the sandbox, and the batch machinery (with a fake grade function).

Also: formula-safe CSV cells, hidden entries, case-insensitive ids, the set-up check (the reference
must score full marks), one-line command-line errors, and merge's checks on malformed shards.

The batch runs here with `grader="test_batch:fake_grade"`: a stand-in for autograder.engine.grade
that scores a part by markers in its file, and can hang, raise or kill its judge on request. The
real engine is exercised by tests/test_redteam.py (the same batch, sandboxed, on real code).
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from instructor import intake
from instructor.batch import Options, merge, run_batch, student_view
from instructor.sandbox import SECRET_PATHS, Sandbox, detect, no_fork_filter

ROOT = Path(__file__).resolve().parent.parent
FILES = intake.all_graded_files()


# ---------------------------------------------------------------------------------------------
# a fake grade function, importable by the judge processes (module `test_batch`)


def _holds_the_reference(folder: Path) -> bool:
    """The folder's graded files are solutions/'s (the batch grades the reference through the intake, from a
    folder of its own)."""
    names = [f.name for f in (ROOT / "solutions").glob("*.py") if (folder / f.name).is_file()]
    return bool(names) and all((folder / n).read_bytes() == (ROOT / "solutions" / n).read_bytes() for n in names)


def fake_grade(impl_dir, *, parts=None, test_sets=("public",), worker_prefix=None, limits=None, **_):
    """Part n scores its max when its file contains 'CORRECT'; 'HANG' sleeps, 'RAISE' raises,
    'DIE' kills this judge process. Deterministic, and as fast as a report can be made."""
    from autograder.engine import load_rubric

    rubric = load_rubric()
    reference = _holds_the_reference(Path(impl_dir))
    rows, tests = [], []
    for p in rubric.parts:
        if parts and p.number not in parts:
            continue
        text = "".join((Path(impl_dir) / f).read_text() for f in p.files if (Path(impl_dir) / f).is_file())
        if "HANG" in text:
            time.sleep(600)
        if "RAISE" in text:
            raise RuntimeError("grading blew up")
        if "DIE" in text:
            os._exit(3)
        ok = "CORRECT" in text or reference  # the reference scores full marks (the batch checks that first)
        rows.append({"part": p.number, "name": p.name, "points": float(p.points) if ok else 0.0,
                     "max_points": float(p.points), "passed": int(ok), "total": 2, "status": "ok" if ok else "failed",
                     "first_failure": None if ok else {"test": f"public/test_part{p.number}.py::t", "message": "wrong"}})
        tests.append({"id": f"public/test_part{p.number}.py::t", "part": p.number, "set": "public",
                      "outcome": "passed" if ok else "failed", "score": float(p.points) if ok else 0.0,
                      "max_score": float(p.points), "message": "" if ok else "wrong", "output": "x" * 5000})
        tests.append({"id": f"hidden/test_part{p.number}.py::t[0]", "part": p.number, "set": "hidden",
                      "outcome": "failed", "score": 0.0, "max_score": 0.0,
                      "message": "failed (hidden test: details are not shown)"})
    return {"parts": rows, "total": sum(r["points"] for r in rows), "max_total": sum(r["max_points"] for r in rows),
            "tests": tests, "errors": ["hidden/test_part1.py::t[113-203]: grading error"],
            "hashes": {"submission": "s", "tests": "t", "environment": "e"}}


def _submission(folder: Path, marks: dict[str, str]) -> Path:
    folder.mkdir(parents=True)
    for f in FILES:
        (folder / f).write_text(f"# {f}\n{marks.get(f, '')}\n")
    return folder


def _batch(subs: Path, out: Path, **kw) -> dict:
    options = Options(grader="test_batch:fake_grade", test_sets=("public", "hidden"))
    return run_batch(subs, out, options=options, progress=False, sandbox="off", **kw)


def _rows(out: Path) -> dict[str, dict]:
    return {r["student"]: r for r in csv.DictReader(io.StringIO((out / "grades.csv").read_text()))}


# ---------------------------------------------------------------------------------------------
# intake


def test_intake_takes_only_the_graded_files_of_a_folder(tmp_path):
    sub = tmp_path / "alice"
    _submission(sub / "work" / "starter", {"flash_forward.py": "x = 1"})
    (sub / "work" / "starter" / "conftest.py").write_text("raise SystemExit")
    (sub / "notes.txt").write_text("hi")
    (sub / "work" / "starter" / "kv_cache.py").unlink()
    os.symlink("/etc/passwd", sub / "work" / "starter" / "kv_cache.py")  # a link named like a graded file
    taken = intake.take(sub, tmp_path / "dest")
    assert taken.error is None and taken.name == "alice"
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == sorted(set(FILES) - {"kv_cache.py"})
    assert ("work/starter/kv_cache.py", "symbolic link (links are not followed)") in taken.rejected
    assert taken.ignored_count == 2 and "kv_cache.py" not in taken.missing
    assert any("conftest.py" in n for n in taken.notes())


def test_a_missing_graded_file_names_the_misnamed_file_it_resembles(tmp_path):
    """A newcomer's misnamed files (another case, a browser's download copy, an editor's .txt, a typo)
    are not graded, and the note says which file was probably meant; unrelated files are not offered."""
    sub = _submission(tmp_path / "cara", {})
    renames = {"flash_forward.py": "Flash_Forward.py", "kv_cache.py": "kv_cache (1).py",
               "online_softmax.py": "online_softmax.py.txt", "flash_backward.py": "flash_backwrd.py"}
    for right, wrong in renames.items():
        (sub / right).rename(sub / wrong)
    os.remove(sub / "flash_decoding.py")
    (sub / "notes.md").write_text("unrelated")
    taken = intake.take(sub, tmp_path / "dest")
    assert sorted(taken.missing) == sorted([*renames, "flash_decoding.py"])
    assert taken.near == renames  # nothing resembles flash_decoding.py
    notes = "\n".join(taken.notes())
    assert "kv_cache.py: missing (that part scores 0); did you mean 'kv_cache (1).py'?" in notes
    assert "flash_decoding.py: missing (that part scores 0)\n" in notes + "\n" and "notes.md'?" not in notes


def test_a_part_graded_alone_gets_the_graded_files_it_imports(tmp_path):
    """flash_backward.py imports flash_forward.py: with --parts 4 the intake takes both (the engine runs
    the import), so the reference scores full marks there, and a flash_forward.py rejected for a syntax
    error is named as the reason, in part 4's feedback too (not "missing", nor "No module named")."""
    from instructor.grading import grade_one

    taken = intake.take_for_parts(ROOT / "solutions", tmp_path / "dest", [4])
    assert sorted(taken.files) == ["flash_backward.py", "flash_forward.py"] and taken.wanted == sorted(taken.files)
    bad = tmp_path / "bad"
    shutil.copytree(ROOT / "solutions", bad)
    (bad / "flash_forward.py").write_text((bad / "flash_forward.py").read_text() + "\ndef broken(:\n")
    options = Options(parts=[4], test_sets=("public",), sandbox=None, reuse=False)
    good = grade_one(ROOT / "solutions", tmp_path / "w1", options)
    assert good.view["total"] == 20, good.view["parts"]
    graded = grade_one(bad, tmp_path / "w2", options)
    first = graded.view["parts"][0]["first_failure"]["message"]
    assert "it imports flash_forward.py, and flash_forward.py was not accepted: not valid Python" in first, first


def test_intake_rejects_bad_files_with_reasons(tmp_path):
    sub = _submission(tmp_path / "bob", {})
    (sub / "online_softmax.py").write_bytes(b"x = '\xff\xfe'\n")  # not UTF-8
    (sub / "flash_forward.py").write_bytes(b"x = 1\0\n")  # NUL byte
    (sub / "flash_kernel.py").write_text("def f(:\n")  # not Python
    (sub / "kv_cache.py").write_text("#" * (intake.MAX_FILE_BYTES + 1))  # oversize
    os.remove(sub / "flash_decoding.py")
    taken = intake.take(sub, tmp_path / "dest")
    why = dict(taken.rejected)
    assert "not UTF-8" in why["online_softmax.py"]
    assert "NUL" in why["flash_forward.py"]
    assert "not valid Python" in why["flash_kernel.py"] and "line 1" in why["flash_kernel.py"]
    assert "too large" in why["kv_cache.py"]
    assert taken.missing == ["flash_decoding.py"]
    assert list(taken.files) == ["flash_backward.py"]


def test_intake_reads_zips_without_extracting_and_refuses_zip_slip(tmp_path):
    z = tmp_path / "carol.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for f in FILES:
            zf.writestr(f"carol/{f}", f"# {f}\n")
        zf.writestr("../../evil.py", "print('escaped')")
        zf.writestr("/abs/online_softmax.py", "x = 1")
        zf.writestr("carol/..\\sneaky.py", "x = 1")
        link = zipfile.ZipInfo("carol/link.py")
        link.external_attr = (0o120777) << 16  # a symlink entry
        zf.writestr(link, "/etc/passwd")
    before = sorted(p.name for p in tmp_path.iterdir())
    taken = intake.take(z, tmp_path / "dest")
    assert taken.name == "carol" and taken.error is None
    assert sorted(taken.files) == sorted(FILES)
    why = dict(taken.rejected)
    assert "escapes" in why["../../evil.py"] and "absolute" in why["/abs/online_softmax.py"]
    assert "escapes" in why["carol/..\\sneaky.py"] and "symbolic link" in why["carol/link.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["dest"])  # nothing else written
    assert not (tmp_path.parent / "evil.py").exists()


def test_intake_rejects_whole_submissions_it_cannot_use(tmp_path):
    (tmp_path / "dave.tar.gz").write_bytes(b"\x1f\x8b")
    (tmp_path / "erin.zip").write_bytes(b"PK\x03\x04 not really")
    amb = tmp_path / "frank"
    _submission(amb / "a", {})
    _submission(amb / "b", {})
    assert "not a folder or a .zip" in intake.take(tmp_path / "dave.tar.gz", tmp_path / "d1").error
    assert "not a readable zip" in intake.take(tmp_path / "erin.zip", tmp_path / "d2").error
    assert "ambiguous" in intake.take(amb, tmp_path / "d3").error


# ---------------------------------------------------------------------------------------------
# sandbox


def test_sandbox_hides_secrets_blocks_network_and_fork(tmp_path):
    box = detect()
    assert box.mode == "bubblewrap" or box.mode.startswith(("unprivileged-uid (", "rlimits-only ("))
    probe = Path(tempfile.mkdtemp(prefix="sandbox-probe-"))  # its parents must be traversable (uid mode)
    os.chmod(probe, 0o755)
    code = ("import os, socket, sys\n"
            "r = {}\n"
            "try:\n    os.listdir(sys.argv[1]); r['secret'] = True\n"  # visible and readable
            "except OSError:\n    r['secret'] = False\n"
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); r['net'] = True\n"
            "except OSError:\n    r['net'] = False\n"
            "try:\n    open(os.path.join(sys.argv[2], 'w'), 'w'); r['write'] = True\n"
            "except OSError:\n    r['write'] = False\n"
            "try:\n    pid = os.fork()\n    if pid == 0: os._exit(0)\n    os.waitpid(pid, 0); r['fork'] = True\n"
            "except OSError:\n    r['fork'] = False\n"
            "r['uid'] = os.getuid(); print(r)\n")
    boxed = box.with_uid(64099)
    argv = boxed.prefix([str(probe), sys.base_prefix, sys.prefix]) + [
        sys.executable, "-I", "-S", "-c", code, str(SECRET_PATHS[0]), str(probe)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        boxed.sweep()
        shutil.rmtree(probe, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    r = eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 -- our own probe's dict
    if no_fork_filter() is not None:
        assert r["fork"] is False  # the seccomp filter refuses new processes in both modes
    if box.isolating:
        assert (r["secret"], r["net"], r["write"]) == (False, False, False)
        if box.uid is not None:
            assert r["uid"] == 64099
    else:
        pytest.skip(f"filesystem and network isolation need bubblewrap ({box.mode})")


def test_rlimits_only_fallback_says_why():
    box = detect("rlimits")
    assert box.mode == "rlimits-only (forced by the caller)" and box.bwrap is None
    assert Sandbox(box.mode).describe()["sandbox"] == box.mode


# ---------------------------------------------------------------------------------------------
# the batch (fake grade function, no sandbox)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    subs = tmp_path_factory.mktemp("subs")
    _submission(subs / "ann", {f: "CORRECT" for f in FILES})
    _submission(subs / "ben", {"online_softmax.py": "CORRECT"})
    _submission(subs / "cat", {"flash_forward.py": "RAISE"})
    (subs / "eve.txt").write_text("not a submission")
    empty = subs / "fay"
    empty.mkdir()
    (empty / "README.md").write_text("forgot the code")
    return subs


@pytest.fixture(scope="module")
def full(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, _batch(folder, out, jobs=2)


def test_batch_grades_every_entry_and_writes_the_results(full):
    out, summary = full
    rows = _rows(out)
    assert sorted(rows) == ["ann", "ben", "cat", "eve.txt", "fay"]
    assert rows["ann"]["total"] == "100" and rows["ann"]["status"] == "graded"
    assert rows["ben"]["part1"] == "15" and rows["ben"]["total"] == "15"
    assert rows["cat"]["status"] == "failed to grade" and "grading blew up" in rows["cat"]["reason"]
    assert rows["eve.txt"]["status"] == "rejected" and rows["eve.txt"]["total"] == "0"
    assert rows["fay"]["status"] == "rejected" and "no graded files" in (out / "fay" / "feedback.md").read_text()
    assert (summary["graded"], summary["failed_to_grade"], summary["rejected"]) == (2, 1, 2)
    for name in rows:
        v = json.loads((out / name / "feedback.json").read_text())
        assert v["sandbox"].startswith("none") and v["hashes"]["pip_freeze_sha256"]
        gs = json.loads((out / name / "results.json").read_text())
        assert sorted(p.name for p in (out / name).iterdir()) == ["feedback.json", "feedback.md", "results.json"]
        if rows[name]["status"] == "failed to grade":
            continue
        assert gs["score"] == float(rows[name]["total"] or 0)
        assert {t["visibility"] for t in gs["tests"]} <= {"visible", "after_published"}
    # the traceback, for the instructor only: apart from the folders handed to students
    assert "grading blew up" in (out / "_instructor" / "cat" / "grading-error.txt").read_text()
    assert "Traceback" not in (out / "cat" / "feedback.md").read_text()


def test_regrading_gives_byte_identical_grades(folder, full, tmp_path):
    _batch(folder, tmp_path / "again", jobs=0)  # in this process this time: same bytes
    assert (tmp_path / "again" / "grades.csv").read_bytes() == (full[0] / "grades.csv").read_bytes()


def test_shards_merge_to_the_full_result(folder, full, tmp_path):
    for i in (1, 2, 3):
        _batch(folder, tmp_path / f"s{i}", jobs=0, shard=(i, 3))
    assert len(_rows(tmp_path / "s2")) == 2 and len(_rows(tmp_path / "s3")) == 1  # (ben, fay) and (cat)
    merged = merge([tmp_path / f"s{i}" for i in (1, 2, 3)], tmp_path / "merged")
    assert merged.read_bytes() == (full[0] / "grades.csv").read_bytes()
    assert (tmp_path / "merged" / "ann" / "feedback.md").is_file()
    with pytest.raises(SystemExit, match="two shards"):
        merge([tmp_path / "s1", tmp_path / "s1"], tmp_path / "bad")


def test_a_hanging_or_dying_judge_is_replaced_and_the_batch_completes(tmp_path):
    subs = tmp_path / "subs"
    _submission(subs / "die", {"flash_forward.py": "DIE"})
    _submission(subs / "hang", {"online_softmax.py": "HANG"})
    _submission(subs / "ok", {"online_softmax.py": "CORRECT"})
    t0 = time.perf_counter()
    _batch(subs, tmp_path / "out", jobs=1, timeout_s=15)  # the clock starts while the judge may still import
    rows = _rows(tmp_path / "out")
    assert rows["die"]["status"] == "failed to grade" and "judge process died" in rows["die"]["reason"]
    assert rows["hang"]["status"] == "failed to grade" and "longer than 15 s" in rows["hang"]["reason"]
    assert rows["ok"]["total"] == "15" and rows["ok"]["status"] == "graded"  # graded by a fresh judge
    assert time.perf_counter() - t0 < 120  # generous: the hang itself would take 600 s
    # what the student gets says plainly that it is not a grade, and nothing of the instructor's reason
    for name in ("die", "hang"):
        res = json.loads((tmp_path / "out" / name / "results.json").read_text())
        assert "score" not in res and res["visibility"] == "hidden" and res["extra_data"]["regrade"] is True
        (shown,) = [t for t in res["tests"] if t["visibility"] == "visible"]
        assert shown["max_score"] == 0 and "will regrade" in shown["output"] and "not your grade" in shown["output"]
        view = json.loads((tmp_path / "out" / name / "feedback.json").read_text())
        assert view["total"] is None and all(p["points"] is None for p in view["parts"])
        student = "".join((tmp_path / "out" / name / f).read_text() for f in ("results.json", "feedback.json",
                                                                              "feedback.md"))
        assert "longer than" not in student and "died" not in student and "will regrade" in student
        assert sorted(p.name for p in (tmp_path / "out" / name).iterdir()) == ["feedback.json", "feedback.md",
                                                                                "results.json"]
    assert "longer than 15 s" in (tmp_path / "out" / "_instructor" / "hang" / "grading-error.txt").read_text()


def test_student_view_hides_hidden_details_and_truncates_output():
    report = fake_grade(ROOT / "solutions", parts=[1])
    view = student_view(report)
    assert view["errors"] == []  # whether a hidden test could not run would be one more bit out
    public = next(t for t in view["tests"] if t["set"] == "public")
    assert len(public["output"]) < 2200 and "truncated" in public["output"]
    assert all("output" not in t for t in view["tests"] if t["set"] == "hidden")


def test_the_cli_refuses_bad_arguments(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "instructor.batch", *args], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)

    r = run(str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert r.returncode != 0 and "is not a folder" in r.stderr
    r = run(str(tmp_path), "--out", str(tmp_path / "o"), "--shard", "4/3")
    assert r.returncode != 0 and "1 <= i <= n" in r.stderr
    for bad in (["--parts", "a"], ["--parts", "9"], ["--limit", "call_timeout=60"]):  # argparse's and ours
        r = run(str(tmp_path), "--out", str(tmp_path / "o"), *bad)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = run("merge", str(tmp_path / "nope"), "--out", str(tmp_path / "m"))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "no grades.csv" in r.stderr


# ---------------------------------------------------------------------------------------------
# call time limits, calibrated in the judges


class _FakeJudge:
    """A judge's pipe end: answers ("calibrate", parts) with one call time per part (and each part's
    result, for the batch's store)."""

    def __init__(self, slot: int, fail: bool = False) -> None:
        self.slot, self.fail, self.sent, self._reply = slot, fail, [], None
        self.conn = self

    def send(self, msg) -> None:
        self.sent.append(msg)
        if msg[0] == "calibrate":
            self._reply = ("error", "boom") if self.fail else ("ok", {f"part{n}.fn": 0.01 * n for n in msg[1]},
                                                                 {"points": 1.0, "max_points": 1.0, "tests": 1},
                                                                 [{"row": {"part": n}, "tests": []} for n in msg[1]],
                                                                 {str(n): 1.5 * n for n in msg[1]})

    def poll(self, timeout=None) -> bool:
        return self._reply is not None

    def recv(self):
        reply, self._reply = self._reply, None
        return reply


def test_share_out_gives_the_costliest_share_its_least_possible_cost():
    from instructor.batch import share_out

    costs = {1: 2.45, 2: 2.44, 3: 2.47, 4: 2.92, 5: 2.89, 6: 0.58}  # this kit's parts, as measured once
    shares = share_out(costs, 2)
    assert sorted(sum(shares, [])) == sorted(costs) and all(shares)
    assert max(sum(costs[p] for p in s) for s in shares) == pytest.approx(7.36)  # the greedy rule: 7.81
    assert share_out({1: 5.0, 2: 1.0}, 3) == [[1], [2], []]  # more judges than parts: some get none
    assert share_out({1: 1.0}, 1) == [[1]]
    many = {p: float(p) for p in range(1, 21)}  # too many to try: the greedy rule, every part once
    assert sorted(sum(share_out(many, 4), [])) == sorted(many)


def test_calibration_shares_the_parts_out_among_the_judges_and_sends_every_judge_the_limits():
    from autograder.engine.rubric import load_rubric
    from instructor.batch import (PART_BUDGET_FACTOR, PART_BUDGET_FLOOR_S, TIMEOUT_FACTOR, TIMEOUT_FLOOR_S,
                                  _calibrate_in_judges)

    judges = [_FakeJudge(0), _FakeJudge(1)]
    options = Options()
    info = _calibrate_in_judges(judges, options, timeout_s=5)
    shares = [j.sent[0][1] for j in judges]
    numbers = load_rubric().numbers
    assert sorted(shares[0] + shares[1]) == sorted(numbers) and all(shares), shares  # each part once, both busy
    cost = {n: load_rubric().part(n).cost for n in numbers}
    loads = [sum(cost[n] for n in s) for s in shares]
    assert max(loads) - min(loads) <= max(cost.values())  # balanced by the rubric's costs
    want = {f"part{n}.fn": round(max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * 0.01 * n), 2) for n in numbers}
    assert info["scaled"] is True and info["limits_s"] == want
    assert options.limits["call_timeouts"] == want  # replacement judges are started with these options
    budgets = {str(n): round(max(PART_BUDGET_FLOOR_S, PART_BUDGET_FACTOR * 1.5 * n), 1) for n in numbers}
    assert info["part_budgets_s"] == budgets and options.limits["part_budgets"] == budgets
    assert all(j.sent[-1] == ("limits", {"call_timeouts": want, "part_budgets": budgets}) for j in judges)
    assert sorted(e["row"]["part"] for e in info["seeds"] if "row" in e) == sorted(numbers)  # every share's results, for the store


def test_calibration_that_fails_in_one_judge_scales_nothing():
    from instructor.batch import _calibrate_in_judges

    judges = [_FakeJudge(0), _FakeJudge(1, fail=True)]
    options = Options()
    info = _calibrate_in_judges(judges, options, timeout_s=5)
    assert info["scaled"] is False and "boom" in info["reason"]
    assert "call_timeouts" not in options.limits and all(m[0] == "calibrate" for j in judges for m in j.sent)


# ---------------------------------------------------------------------------------------------
# a judge over its memory bound after a grade is replaced


class _Pipe:
    """The judge's end of its pipe, for _judge_main run in this process."""

    def __init__(self, messages: list) -> None:
        self.messages, self.sent = list(messages), []

    def recv(self):
        return self.messages.pop(0)

    def send(self, msg) -> None:
        self.sent.append(msg)


@pytest.mark.parametrize("held", [None, 5 << 30])
def test_a_judge_still_over_its_memory_bound_after_a_grade_asks_to_be_replaced(tmp_path, monkeypatch, held):
    import signal

    from instructor import batch
    from instructor.grading import Graded

    monkeypatch.setattr(signal, "signal", lambda *a: None)  # _judge_main ignores Ctrl-C: not in pytest's process
    monkeypatch.setattr(batch.memory, "over_bound", lambda: held)
    monkeypatch.setattr(batch, "grade_one", lambda entry, work, options, name, **_: Graded(
        name, str(entry), "graded", "", {"total": 1.0}))
    pipe = _Pipe([batch.Task("one", str(tmp_path / "one"), str(tmp_path / "work")), None])
    batch._judge_main(pipe, 0, Options())
    assert len(pipe.sent) == 1 and pipe.sent[0][0] == "ok"
    assert pipe.sent[0][4] is (held is not None)


class _RetiringJudge:
    """A judge whose first reply asks to be replaced (the rest do not); a real pipe, no process."""

    made: list["_RetiringJudge"] = []

    def __init__(self, ctx, slot: int, options) -> None:
        import multiprocessing as mp

        from instructor.grading import Graded

        self.slot, self.task, self.deadline, self.started, self.killed = slot, None, 1e18, 0.0, False
        self.conn, self._child = mp.Pipe()
        self._idle, self._never = mp.Pipe()
        self.proc = self
        self.sentinel, self.exitcode = self._idle, None
        self._graded, self._retire = Graded, not _RetiringJudge.made
        self.messages: list = []
        _RetiringJudge.made.append(self)

    def is_alive(self) -> bool:
        return not self.killed

    def join(self, timeout=None) -> None:
        pass

    def submit(self, task, timeout: float) -> None:
        self.task = task
        graded = self._graded(task.name, task.entry, "graded", "", {"total": 1.0})
        self._child.send(("ok", graded.to_json(), 0.1, {f"part of {task.name}": {"tests": []}}, self._retire))

    def send_quietly(self, message: tuple) -> None:
        self.messages.append(message)

    def kill(self) -> None:
        self.killed = True


def test_the_batch_replaces_a_judge_that_asks_to_be_and_keeps_its_result(tmp_path, monkeypatch):
    from instructor import batch

    monkeypatch.setattr(batch, "Judge", _RetiringJudge)
    monkeypatch.setattr(batch, "_finish", lambda out, e, graded: graded)
    monkeypatch.setattr(_RetiringJudge, "made", [])
    entries = [batch.Entry(name, tmp_path / name, name) for name in ("one", "two", "three")]
    results: dict = {}
    replaced: dict = {}
    batch._grade_all(entries, tmp_path / "work", tmp_path / "out", 1, Options(), 60, False, results, {},
                     replaced=replaced)
    assert [g.status for g in results.values()] == ["graded"] * 3  # the first judge's result stands
    made = _RetiringJudge.made
    assert len(made) == 2 and made[0].killed and made[1].task.name == "three"
    assert made[0].task.name == "one"  # replaced after its first submission, not before
    assert replaced == {"memory": 1}  # the summary's judges_replaced
    # the judge that replaces it gets what it had graded and shared, before its first submission
    shares = [m[1] for m in made[1].messages if m and m[0] == "share"]
    assert shares and "part of one" in shares[0], made[1].messages


# ---------------------------------------------------------------------------------------------
# hostile ids and cells, hidden entries, the set-up check, the command line, merge


def fake_grade_no_tests(impl_dir, *, parts=None, **_):
    """A grader whose tests are not where it looks: nothing runs, the reference scores 0/0."""
    return {"parts": [], "total": 0.0, "max_total": 0.0, "tests": [], "errors": ["no tests collected"], "hashes": {}}


FORMULA = ("=", "+", "-", "@", "\t", "\r", "|", "%", "\uff1d")


@pytest.mark.parametrize("text", ["=1+1", "+cmd", "-2+3", "@SUM(1)", "\t=x", "  =x", "\uff1dx", "|calc", "%x"])
def test_cell_neutralises_what_a_spreadsheet_would_run(text):
    from instructor.batch import _cell

    assert _cell(text).startswith("'") and _cell(text)[1:] == text
    assert _cell("alice") == "alice" and _cell("") == ""


def test_no_text_cell_a_submission_sets_starts_like_a_formula(tmp_path):
    from instructor.batch import Graded, _cell, write_grades_csv

    subs = tmp_path / "subs"
    for name in ("+cmd", "-2+3", "@SUM(1)", "=HYPERLINK(x)", "%x", "|x"):
        _submission(subs / name, {"online_softmax.py": "CORRECT"})
    (subs / "=evil.txt").write_text("not a submission")
    _batch(subs, tmp_path / "out", jobs=0)
    rows = _rows(tmp_path / "out")
    assert len(rows) == 7
    for r in rows.values():
        for col in ("student", "source", "reason"):
            assert not r[col].lstrip(" ").startswith(FORMULA) or r[col].startswith("'"), (col, r[col])
        assert r["student"][0].isalnum() and (tmp_path / "out" / r["student"] / "feedback.md").is_file()
    assert {r["source"] for r in rows.values()} >= {"'+cmd", "'-2+3", "'@SUM(1)", "'=HYPERLINK(x)", "'=evil.txt"}
    # the reason column goes through the same function (a reason quoting a submission's own text)
    g = Graded(name="a", source="a", status="rejected", reason="=cmd|' /C calc'!A0",
               view={"parts": [], "total": 0, "max_total": 0})
    write_grades_csv(tmp_path / "g.csv", [g], [1])
    row = next(csv.DictReader((tmp_path / "g.csv").open()))
    assert row["reason"] == _cell("=cmd|' /C calc'!A0") == "'=cmd|' /C calc'!A0"


def test_hidden_entries_are_listed_as_skipped_and_ids_differ_ignoring_case(tmp_path, capsys):
    from instructor.batch import print_summary

    subs = tmp_path / "subs"
    _submission(subs / "Alice", {"online_softmax.py": "CORRECT"})
    with zipfile.ZipFile(_mkdir(subs) / "alice.zip", "w") as z:
        z.writestr("online_softmax.py", "CORRECT")
    _submission(subs / ".bob", {"online_softmax.py": "CORRECT"})
    (subs / ".DS_Store").write_bytes(b"\0\0")
    summary = _batch(subs, tmp_path / "out", jobs=0)
    rows = _rows(tmp_path / "out")
    assert len(rows) == 2 and len({n.lower() for n in rows}) == 2, sorted(rows)
    assert {r["source"] for r in rows.values()} == {"Alice", "alice.zip"}
    assert [s["source"] for s in summary["skipped"]] == [".DS_Store", ".bob"]
    assert all("dot" in s["reason"] for s in summary["skipped"])
    print_summary(summary, tmp_path / "out")
    err = capsys.readouterr().err
    assert "skipped 2 hidden entries" in err and ".bob" in err and "judges replaced" not in err
    assert summary["judges_replaced"] == {}  # in-process: no judge to replace
    print_summary({**summary, "judges_replaced": {"memory": 2, "died": 0}}, tmp_path / "out")
    assert "2 (memory)" in capsys.readouterr().err.replace("\n", " ")


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _one_line_error(args: list[str], capsys) -> str:
    """main(args) refuses: exit status non-zero, one line on stderr (or in SystemExit), no traceback."""
    from instructor.batch import main

    with pytest.raises(SystemExit) as e:
        main(args)
    code = e.value.code
    text = code if isinstance(code, str) else capsys.readouterr().err
    assert code not in (0, None) and text.startswith("error: "), (args, code, text)
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    return text


def test_bad_command_lines_get_one_line_each(tmp_path, capsys):
    subs = _mkdir(tmp_path / "subs")
    (tmp_path / "afile").write_text("x")
    out = ["--out", str(tmp_path / "o")]
    cases = {
        ("--parts", "a"): "--parts", ("--parts", ","): "--parts", ("--parts", "9"): "part numbers of the rubric",
        ("--parts", "0"): "part numbers of the rubric", ("--parts", "1,1"): "distinct",
        ("--timeout", "nan"): "--timeout", ("--timeout", "0"): "--timeout", ("--timeout", "-5"): "--timeout",
        ("--sets", "bogus"): "--sets", ("--sets", ","): "--sets", ("--jobs", "-3"): "--jobs", ("--jobs", "0"): "--jobs",
        ("--jobs", "x"): "--jobs", ("--limit", "call_timeout=60"): "call_timeout_s, cpu_s",
        ("--limit", "call_timeout_s=-1"): "positive", ("--limit", "call_timeout_s=nan"): "finite",
        ("--limit", "memory_mb=1.5"): "whole", ("--limit", "x"): "KEY=NUMBER",
        ("--limit", "judge_memory_mb=300"): "at least 1024",
        ("--tests-dir", str(tmp_path / "nonexist")): "--tests-dir", ("--shard", "0/2"): "1 <= i <= n",
    }
    for extra, want in cases.items():
        assert want in _one_line_error([str(subs), *out, *extra], capsys), extra
    assert "is a file" in _one_line_error([str(subs), "--out", str(tmp_path / "afile")], capsys)
    assert "inside the output folder" in _one_line_error([str(subs), "--out", str(tmp_path)], capsys)
    assert "inside the submissions folder" in _one_line_error([str(subs), "--out", str(subs / "o")], capsys)
    assert not (tmp_path / "o").exists()


def test_the_batch_refuses_when_the_reference_does_not_score_full_marks(tmp_path):
    from instructor.batch import check_reference

    subs = tmp_path / "subs"
    _submission(subs / "ann", {f: "CORRECT" for f in FILES})
    options = Options(grader="test_batch:fake_grade_no_tests", scale_timeouts=False)
    with pytest.raises(SystemExit, match=r"reference solutions score 0/0 \(0 tests run\) with these options"):
        run_batch(subs, tmp_path / "out", jobs=1, options=options, progress=False, sandbox="off", allow_weak=True)
    assert not (tmp_path / "out").exists()  # refused before anything was written
    with pytest.raises(SystemExit, match="score 50/100"):
        check_reference({"points": 50.0, "max_points": 100.0, "tests": 9}, Options(parts=[1, 2]))
    with pytest.raises(SystemExit, match="grading the reference solutions failed"):
        check_reference({"error": "FileNotFoundError: x"}, Options())
    ok = {"points": 15.0, "max_points": 15.0, "tests": 4}
    assert check_reference(ok, Options()) is ok


def test_the_real_engine_reference_check_catches_a_tests_folder_without_tests(tmp_path):
    """The real grader: calibrating (one judge, in this process) and fixed limits alike."""
    subs = tmp_path / "subs"
    _submission(subs / "ann", {})
    empty = _mkdir(tmp_path / "no-tests")
    for scale in (True, False):
        options = Options(parts=[1], test_sets=("public",), tests_dir=str(empty), scale_timeouts=scale)
        with pytest.raises(SystemExit, match=r"the reference solutions score 0/15 \(0 tests run\)"):
            run_batch(subs, tmp_path / f"out{scale}", jobs=0, options=options, progress=False, sandbox="off",
                      allow_weak=True)
        assert not (tmp_path / f"out{scale}").exists()  # refused before any file was written


def test_a_refused_two_judge_batch_leaves_no_empty_output_folder(tmp_path):
    """With two judges the reference is checked in the judges (after --out was made): the refusal
    removes the folder it made, and keeps one the instructor had."""
    subs = tmp_path / "subs"
    _submission(subs / "ann", {})
    _submission(subs / "ben", {})
    options = Options(parts=[1], test_sets=("public",), tests_dir=str(_mkdir(tmp_path / "no-tests")))
    kept = _mkdir(tmp_path / "kept")
    for out in (tmp_path / "new", kept):
        with pytest.raises(SystemExit, match=r"the reference solutions score 0/15"):
            run_batch(subs, out, jobs=2, options=options, progress=False, sandbox="off", allow_weak=True)
    assert not (tmp_path / "new").exists() and kept.is_dir()


def test_calibration_in_judges_sums_the_reference_score_of_every_share():
    from instructor.batch import _calibrate_in_judges

    judges = [_FakeJudge(0), _FakeJudge(1)]
    info = _calibrate_in_judges(judges, Options(), timeout_s=5)
    assert info["reference"]["points"] == 2.0 and info["reference"]["tests"] == 2
    info = _calibrate_in_judges([_FakeJudge(0), _FakeJudge(1, fail=True)], Options(), timeout_s=5)
    assert "boom" in info["reference"]["error"]


@pytest.fixture(scope="module")
def shards(folder, tmp_path_factory):
    """The module's folder (5 entries) in 6 shards: the 6th is empty."""
    base = tmp_path_factory.mktemp("shards")
    for i in (1, 2, 3, 4, 5, 6):
        _batch(folder, base / f"s{i}", jobs=0, shard=(i, 6))
    return base, [base / f"s{i}" for i in (1, 2, 3, 4, 5, 6)]


def test_an_empty_shard_has_the_part_columns_and_a_complete_set_merges(shards, full, tmp_path):
    base, dirs = shards
    assert (dirs[5] / "grades.csv").read_text().splitlines()[0] == (full[0] / "grades.csv").read_text().splitlines()[0]
    merged = merge(dirs, tmp_path / "m")
    assert merged.read_bytes() == (full[0] / "grades.csv").read_bytes()


def _copy(dirs: list[Path], tmp_path: Path) -> list[Path]:
    copies = []
    for d in dirs:
        shutil.copytree(d, tmp_path / "c" / d.name)
        copies.append(tmp_path / "c" / d.name)
    return copies


def _summary_edit(d: Path, **changes) -> None:
    s = json.loads((d / "summary.json").read_text())
    s.update(changes)
    (d / "summary.json").write_text(json.dumps(s))


@pytest.mark.parametrize("damage, want", [
    (lambda d: (d / "summary.json").write_text("{not json"), "summary.json: not valid JSON"),
    (lambda d: (d / "summary.json").write_text("[]"), "summary.json: holds a list"),
    (lambda d: _summary_edit(d, shard="1/6"), '"shard" is "1/6"'),
    (lambda d: _summary_edit(d, shard=[3, 2]), "out of range"),
    (lambda d: _summary_edit(d, shard=[True, 6]), '"shard" is'),
    (lambda d: _summary_edit(d, entries=["ann"]), "entry list does not match"),
    (lambda d: (d / "grades.csv").write_bytes(b"student,\xff\n"), "grades.csv: not UTF-8"),
    (lambda d: (d / "grades.csv").write_text(""), "grades.csv: empty"),
    (lambda d: (d / "grades.csv").write_text((d / "grades.csv").read_text().replace("ann,", "../etc,", 1)),
     "not one of the run's student ids"),
    (lambda d: (d / "grades.csv").write_text((d / "grades.csv").read_text().replace(",part6", "", 1)), "columns"),
])
def test_merge_refuses_malformed_shards_in_one_line_naming_the_file_before_copying(shards, tmp_path, damage, want):
    _, dirs = shards
    copies = _copy(dirs, tmp_path)
    damage(copies[0])
    with pytest.raises(SystemExit) as e:
        merge(copies, tmp_path / "m")
    msg = str(e.value.code)
    assert want in msg and str(copies[0]) in msg and len(msg.splitlines()) == 1, msg
    assert not (tmp_path / "m").exists()


def test_merge_refuses_shards_cut_from_other_folders_or_graded_differently(folder, shards, tmp_path):
    _, dirs = shards
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    shutil.rmtree(other / "ben")  # one student fewer: without the entry lists, ben would silently be missing
    _batch(other, tmp_path / "o2", jobs=0, shard=(2, 6))
    with pytest.raises(SystemExit, match="cut from different submission folders"):
        merge([*dirs[:1], tmp_path / "o2", *dirs[2:]], tmp_path / "m1")
    options = Options(grader="test_batch:fake_grade", test_sets=("public", "hidden"), limits={"memory_mb": 2048})
    run_batch(folder, tmp_path / "o3", jobs=0, shard=(3, 6), options=options, progress=False, sandbox="off")
    with pytest.raises(SystemExit, match=r"graded differently \(they differ in limits\)"):
        merge([*dirs[:2], tmp_path / "o3", *dirs[3:]], tmp_path / "m2")
    options = Options(grader="test_batch:fake_grade", test_sets=("public",))
    run_batch(folder, tmp_path / "o4", jobs=0, shard=(4, 6), options=options, progress=False, sandbox="off")
    with pytest.raises(SystemExit, match="differ in test_sets"):
        merge([*dirs[:3], tmp_path / "o4", *dirs[4:]], tmp_path / "m3")
    copies = _copy(dirs, tmp_path)
    (copies[1] / "grades.csv").write_text((copies[1] / "grades.csv").read_text().splitlines()[0] + "\n")
    with pytest.raises(SystemExit, match="no shard has a row for ben"):
        merge(copies, tmp_path / "m4")
    with pytest.raises(SystemExit, match="inside the shard folder"):
        merge(dirs, dirs[0] / "all")
    assert not any((tmp_path / m).exists() for m in ("m1", "m2", "m3", "m4")) and not (dirs[0] / "all").exists()


# ---------------------------------------------------------------------------------------------
# the output folder: a reused --out keeps no earlier feedback; merge never writes into a shard


def test_a_reused_out_keeps_no_feedback_from_an_earlier_run_and_deletes_nothing_else(tmp_path):
    subs = tmp_path / "subs"
    _submission(subs / "ann", {"online_softmax.py": "CORRECT"})
    _submission(subs / "zero", {})
    _submission(subs / "cat", {"flash_forward.py": "RAISE"})
    out = tmp_path / "out"
    _batch(subs, out, jobs=0)
    assert (out / "zero" / "results.json").is_file() and (out / "_instructor" / "cat" / "grading-error.txt").is_file()
    (out / "zero" / "mine.txt").write_text("the instructor's own note")  # not the batch's: stays
    (out / "notes").mkdir()  # nobody's student folder: untouched
    shutil.rmtree(subs / "zero")
    shutil.rmtree(subs / "cat")
    _submission(subs / "cat", {"flash_forward.py": "CORRECT"})
    summary = _batch(subs, out, jobs=0)
    assert sorted(_rows(out)) == ["ann", "cat"] and summary["student_folders"] == ["ann", "cat"]
    assert sorted(p.name for p in (out / "zero").iterdir()) == ["mine.txt"]  # its feedback is gone
    assert not (out / "_instructor" / "cat").exists()  # the earlier run's traceback too
    assert (out / "notes").is_dir() and (out / "ann" / "feedback.md").is_file()
    # an output folder of an earlier version (no record, grading-error.txt in the student's folder)
    (out / "_instructor" / "written.json").unlink()
    (out / "cat" / "grading-error.txt").write_text("old traceback")
    shutil.rmtree(subs / "cat")
    _batch(subs, out, jobs=0)
    assert not (out / "cat").exists() and sorted(_rows(out)) == ["ann"]


def test_an_out_holding_a_student_folder_no_batch_wrote_is_refused_before_grading(tmp_path, capsys):
    from instructor.batch import main

    subs = tmp_path / "subs"
    _submission(subs / "ann", {"online_softmax.py": "CORRECT"})
    out = _mkdir(tmp_path / "out")
    (out / "ann").mkdir()
    (out / "ann" / "keep.txt").write_text("x")
    with pytest.raises(SystemExit, match="already holds ann, which no batch run wrote"):
        _batch(subs, out, jobs=0)
    (out / "_instructor").mkdir()
    (out / "_instructor" / "written.json").write_text("[not json")
    assert "not the batch's record" in _one_line_error([str(subs), "--out", str(out), "--sandbox", "off",
                                                        "--allow-weak-sandbox"], capsys)
    assert sorted(p.name for p in out.rglob("*")) == ["_instructor", "ann", "keep.txt", "written.json"]


def test_a_second_batch_into_an_out_that_a_running_batch_holds_is_refused_in_one_line(tmp_path, capsys):
    """Two batches at once into one --out would mix their student folders, which neither run's record
    (written.json) then accounts for: the second refuses before it grades or writes anything."""
    from instructor.batch import claim_out

    subs = tmp_path / "subs"
    _submission(subs / "ann", {"online_softmax.py": "CORRECT"})
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from instructor.batch import claim_out; claim_out(Path(sys.argv[1])); "
                               "print('held', flush=True); time.sleep(60)", str(out)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"  # a batch running into out (another process)
        err = _one_line_error([str(subs), "--out", str(out), "--sandbox", "off", "--allow-weak-sandbox"], capsys)
        assert "another batch is writing into --out" in err and "choose another --out" in err, err
        assert list(out.iterdir()) == []  # nothing written
    finally:
        holder.kill()
        holder.wait()
    os.close(claim_out(out))  # released with its holder
    _batch(subs, out, jobs=0)
    assert sorted(_rows(out)) == ["ann"]


def test_an_empty_submissions_folder_grades_nobody_and_says_so(tmp_path, capsys):
    from instructor.batch import main

    subs = _mkdir(tmp_path / "subs")
    assert main([str(subs), "--out", str(tmp_path / "out"), "--sandbox", "off", "--allow-weak-sandbox", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()  # the summary table, then the warning
    assert err[-1:] == [f"warning: {subs} holds no submission (a folder or a .zip per student), so grades.csv has no "
                   "rows; check the path"]
    assert (tmp_path / "out" / "grades.csv").read_text().count("\n") == 1  # the header only


def test_merge_refuses_to_write_a_student_folder_into_a_shard_folder(tmp_path):
    """A student named like a shard folder, merged into the shards' parent: refused before writing."""
    subs = tmp_path / "subs"
    _submission(subs / "ann", {"online_softmax.py": "CORRECT"})
    _submission(subs / "shard-2", {"flash_forward.py": "CORRECT"})
    out = tmp_path / "out"
    for i in (1, 2):
        _batch(subs, out / f"shard-{i}", jobs=0, shard=(i, 2))
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(SystemExit, match=r"student shard-2 would be written to .*shard-2.* shard folder"):
        merge([out / "shard-1", out / "shard-2"], out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before  # nothing written
    merged = merge([out / "shard-1", out / "shard-2"], tmp_path / "all")
    assert [r["student"] for r in csv.DictReader(merged.open())] == ["ann", "shard-2"]
    assert (tmp_path / "all" / "shard-2" / "feedback.md").is_file()
