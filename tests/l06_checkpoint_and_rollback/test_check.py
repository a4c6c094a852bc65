"""Lesson 06 checkers: the solutions pass, the untouched exercises are "not done", every known wrong save or
load is rejected with a message that names its mistake, each rule of the tables recognises its own case, and
junk never raises."""

import copy
import os
import random
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.l06_checkpoint_and_rollback import check as l06
from amp_lessons.l06_checkpoint_and_rollback.check import check_resume, check_save_checkpoint

LESSON = "06_checkpoint_and_rollback.ipynb"


# ------------------------------------------------------------------------------------------ the checkers


def sol(name):
    return solution(LESSON, name)


def test_solution_passes():
    assert check_save_checkpoint(sol("save_checkpoint")).passed
    result = check_resume(sol("save_checkpoint"), sol("load_checkpoint"))
    assert result.passed, result.message


def test_untouched_exercise_is_not_done():
    save, load = exercise(LESSON, "save_checkpoint"), exercise(LESSON, "load_checkpoint")
    assert check_save_checkpoint(save).status == "not done"
    assert check_resume(save, load).status == "not done"
    assert check_resume(sol("save_checkpoint"), load).status == "not done"


def test_checks_leave_the_learner_rng_and_cwd_alone():
    cwd = os.getcwd()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    check_resume(sol("save_checkpoint"), sol("load_checkpoint"))
    check_save_checkpoint(sol("save_checkpoint"))
    assert torch.equal(torch.rand(3), expected) and os.getcwd() == cwd


# Wrong answers for 06.1 ----------------------------------------------------------------------------------


def _payload(model, optimizer, scaler, step, config, numpy_raw=False):
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state()
    return {
        "step": step,
        "config": dict(config),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": {
            "python": [version, list(internal), gauss],
            "numpy": (
                list(numpy_state)
                if numpy_raw
                else [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]]
            ),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    }


def save_direct(path, model, optimizer, scaler, step, config):
    torch.save(_payload(model, optimizer, scaler, step, config), path)


def save_temp_elsewhere(path, model, optimizer, scaler, step, config):
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.join(os.path.dirname(os.path.dirname(path))))
    os.close(fd)
    torch.save(_payload(model, optimizer, scaler, step, config), tmp)
    os.replace(tmp, path)


def save_by_copy(path, model, optimizer, scaler, step, config):
    tmp = str(path) + ".partial"
    torch.save(_payload(model, optimizer, scaler, step, config), tmp)
    shutil.copyfile(tmp, path)
    os.remove(tmp)


def save_no_cleanup(path, model, optimizer, scaler, step, config):
    tmp = str(path) + ".partial"
    torch.save(_payload(model, optimizer, scaler, step, config), tmp)
    os.replace(tmp, path)


def save_fixed_tmp_name(path, model, optimizer, scaler, step, config):
    tmp = os.path.join(os.path.dirname(path), "tmp.pt")
    try:
        torch.save(_payload(model, optimizer, scaler, step, config), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_and_delete_old(path, model, optimizer, scaler, step, config):
    folder = os.path.dirname(path)
    for name in os.listdir(folder):
        if name.endswith(".pt"):
            os.remove(os.path.join(folder, name))
    save_no_cleanup(path, model, optimizer, scaler, step, config)


def save_swallowing_errors(path, model, optimizer, scaler, step, config):
    tmp = str(path) + ".partial"
    try:
        torch.save(_payload(model, optimizer, scaler, step, config), tmp)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.remove(tmp)


def _atomic(payload, path):
    tmp = str(path) + ".partial"
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_numpy_raw(path, model, optimizer, scaler, step, config):
    _atomic(_payload(model, optimizer, scaler, step, config, numpy_raw=True), path)


def save_whole_objects(path, model, optimizer, scaler, step, config):
    _atomic({"model": model, "optimizer": optimizer, "step": step}, path)


def save_into_cwd(path, model, optimizer, scaler, step, config):
    _atomic(_payload(model, optimizer, scaler, step, config), "checkpoint.pt")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (save_direct, "torch.save wrote straight into `path`"),
        (save_temp_elsewhere, "not next to the checkpoint"),
        (save_by_copy, "did not arrive at `path` through os.replace"),
        (save_fixed_tmp_name, "removed ['tmp.pt']"),
        (save_and_delete_old, "removed ['older_run.pt', 'tmp.pt']"),
        (save_swallowing_errors, "hid a failed write"),
        (save_numpy_raw, "NumPy's RNG state"),
        (save_whole_objects, "not whole objects"),
        (save_into_cwd, "current working directory"),
    ],
)
def test_save_check_names_each_mistake(wrong, words):
    result = check_save_checkpoint(wrong)
    assert not result.passed and result.status == "failed", result.message
    assert words in result.message, result.message


def test_save_check_names_leftover_temp_file_after_failure():
    result = check_save_checkpoint(save_no_cleanup)
    assert "left ['run.ckpt.partial'] behind" in result.message and "except" in result.message


# Wrong answers for 06.2 ----------------------------------------------------------------------------------


def make_load(
    *,
    model=True,
    optimizer=True,
    scaler=True,
    rng=("python", "numpy", "torch", "cuda"),
    step=None,
    config=True,
    weights_only=True,
    pair=True,
    eval_mode=False,
):
    def load_checkpoint(path, model_, optimizer_, scaler_):
        kwargs = {} if weights_only is None else {"weights_only": weights_only}
        payload = torch.load(path, map_location="cpu", **kwargs)
        if model:
            model_.load_state_dict(payload["model"])
        if optimizer:
            optimizer_.load_state_dict(payload["optimizer"])
        if scaler == "scale only":
            scaler_.load_state_dict({**scaler_.state_dict(), "scale": payload["scaler"]["scale"]})
        elif scaler:
            scaler_.load_state_dict(payload["scaler"])
        if "python" in rng:
            version, internal, gauss = payload["rng"]["python"]
            random.setstate((version, tuple(internal), gauss))
        if "numpy" in rng:
            kind, keys, *rest = payload["rng"]["numpy"]
            np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
        if "torch" in rng:
            torch.set_rng_state(payload["rng"]["torch"])
        if "cuda" in rng and payload["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(payload["rng"]["cuda"])
        if eval_mode:
            model_.eval()
        if not pair:
            return payload["step"]
        return (payload["step"] if step is None else step), (payload["config"] if config else {})

    return load_checkpoint


def make_save(*, skip=()):
    def save_checkpoint(path, model, optimizer, scaler, step, config):
        payload = _payload(model, optimizer, scaler, step, config)
        for key in skip:
            payload.pop(key)
        _atomic(payload, path)

    return save_checkpoint


@pytest.mark.parametrize(
    "save, load, words",
    [
        (make_save(skip=("scaler",)), make_load(scaler=False), "GradScaler state not saved"),
        (make_save(), make_load(scaler=False), "GradScaler state saved but not restored"),
        (make_save(), make_load(scaler="scale only"), "Only part of the GradScaler state came back"),
        (make_save(skip=("optimizer",)), make_load(optimizer=False), "Optimizer state not saved"),
        (make_save(), make_load(optimizer=False), "Optimizer state not restored"),
        (make_save(), make_load(rng=()), "RNG not restored"),
        (make_save(), make_load(rng=("torch",)), "Python's `random`"),
        (make_save(), make_load(rng=("python", "numpy")), "torch's CPU generator"),
        (make_save(), make_load(step=0), "Step counter lost"),
        (make_save(), make_load(config=False), "The config came back as {}"),
        (make_save(), make_load(pair=False), "must return the pair (step, config)"),
        (make_save(), make_load(model=False), "weights were not restored"),
        (make_save(), make_load(weights_only=False), "weights_only=False"),
        (make_save(), make_load(weights_only=None), "pass weights_only=True explicitly"),
        (make_save(), make_load(eval_mode=True), "diverges from the uninterrupted one"),
    ],
)
def test_resume_check_names_each_mistake(save, load, words):
    result = check_resume(save, load)
    assert not result.passed and result.status == "failed", result.message
    assert words in result.message, result.message


def test_resume_check_names_rng_not_saved():
    def save(path, model, optimizer, scaler, step, config):
        payload = _payload(model, optimizer, scaler, step, config)
        payload.pop("rng")
        _atomic(payload, path)

    def load(path, model, optimizer, scaler):
        payload = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        scaler.load_state_dict(payload["scaler"])
        return payload["step"], payload["config"]

    result = check_resume(save, load)
    assert "RNG not restored" in result.message and "NumPy" in result.message


# Junk ----------------------------------------------------------------------------------------------------


def raises(*args):
    raise ValueError("boom")


def writes_junk(path, model, optimizer, scaler, step, config):
    with open(path, "w") as handle:
        handle.write("not a checkpoint")


def deletes_folder(path, model, optimizer, scaler, step, config):
    shutil.rmtree(os.path.dirname(path))


def returns_nan(*args):
    return float("nan"), float("nan")


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "save_checkpoint",
        42,
        lambda path: None,
        raises,
        writes_junk,
        deletes_folder,
        returns_nan,
        lambda *a: None,
    ],
)
def test_save_check_never_raises_on_junk(junk):
    result = check_save_checkpoint(junk)
    assert not result.passed and result.status in ("failed", "not done"), result.message
    assert result.message


@pytest.mark.parametrize(
    "save, load",
    [
        (None, None),
        ("x", "y"),
        (sol, sol),
        (raises, raises),
        (writes_junk, make_load()),
        (make_save(), None),
        (make_save(), raises),
        (make_save(), returns_nan),
        (make_save(), lambda path: None),
        (make_save(), lambda *a: ("six", {})),
        (make_save(), lambda *a: (torch.tensor([6, 6]), None)),
        (deletes_folder, make_load()),
        (lambda *a: None, make_load()),
    ],
)
def test_resume_check_never_raises_on_junk(save, load):
    result = check_resume(save, load)
    assert not result.passed and result.status in ("failed", "not done"), result.message
    assert result.message


def test_strict_mode_raises_on_a_wrong_answer(strict):
    with pytest.raises(AssertionError):
        check_save_checkpoint(save_direct)


# ------------------------------------------------------------------------------- the rule tables, one by one


def rule_names(table):
    return {rule.name for rule in table}


BEFORE = {"notes.txt": b"notes", "tmp.pt": b"a learner file"}
GOOD_SAVE = l06.SaveSeen(
    "/run/run.ckpt",
    BEFORE,
    {**BEFORE, "run.ckpt": b"new"},
    [],
    ["/run/tmpab12"],
    [("/run/tmpab12", "/run/run.ckpt")],
)
SAVE_RULE_CASES = {
    "wrote into the current directory": dict(in_cwd=["checkpoint.pt"]),
    "touched other files": dict(after={"notes.txt": b"notes", "run.ckpt": b"new"}),
    "no file at path": dict(after=dict(BEFORE)),
    "left a file next to the checkpoint": dict(after={**BEFORE, "run.ckpt": b"new", "run.ckpt.partial": b""}),
    "never called torch.save": dict(saves=[]),
    "torch.save straight into path": dict(saves=["/run/run.ckpt"], moves=[]),
    "not moved into place by os.replace": dict(moves=[]),
    "temporary file in another folder": dict(
        saves=["/elsewhere/tmp"], moves=[("/elsewhere/tmp", "/run/run.ckpt")]
    ),
}


@pytest.mark.parametrize("name", SAVE_RULE_CASES)
def test_each_save_rule_recognises_its_case(name):
    seen = replace(GOOD_SAVE, **SAVE_RULE_CASES[name])
    rule = first_mistake(l06.SAVE_MISTAKES, seen)
    assert rule is not None and rule.name == name
    assert rule.text(seen)
    assert first_mistake(l06.SAVE_MISTAKES, GOOD_SAVE) is None
    assert set(SAVE_RULE_CASES) == rule_names(l06.SAVE_MISTAKES)


WEIGHTS_ONLY_CASES = {
    "NumPy objects": "Unsupported global: GLOBAL numpy.core.multiarray._reconstruct",
    "a TorchVersion": "Unsupported global: GLOBAL torch.torch_version.TorchVersion",
    "whole objects": "Unsupported global: GLOBAL amp_lessons.core.models.SensorClassifier",
}


@pytest.mark.parametrize("name", WEIGHTS_ONLY_CASES)
def test_each_weights_only_hint_recognises_its_case(name):
    rule = first_mistake(l06.WEIGHTS_ONLY_HINTS, WEIGHTS_ONLY_CASES[name])
    assert rule is not None and rule.name == name
    assert first_mistake(l06.WEIGHTS_ONLY_HINTS, "invalid load key, 'x'") is None
    assert set(WEIGHTS_ONLY_CASES) == rule_names(l06.WEIGHTS_ONLY_HINTS)


OLD = {**BEFORE, "run.ckpt": b"the previous checkpoint"}
GOOD_INTERRUPTED = l06.SaveSeen("/run/run.ckpt", OLD, dict(OLD), outcome="raised")
INTERRUPTED_RULE_CASES = {
    "raised another error": dict(outcome="other", error="ValueError: boom"),
    "deleted the previous checkpoint": dict(after=dict(BEFORE)),
    "overwrote the previous checkpoint": dict(after={**BEFORE, "run.ckpt": b"half"}),
    "left the temporary file": dict(after={**OLD, "tmpab12": b"half"}),
    "hid the failed write": dict(outcome="returned"),
}


@pytest.mark.parametrize("name", INTERRUPTED_RULE_CASES)
def test_each_interrupted_save_rule_recognises_its_case(name):
    seen = replace(GOOD_INTERRUPTED, **INTERRUPTED_RULE_CASES[name])
    rule = first_mistake(l06.INTERRUPTED_SAVE_MISTAKES, seen)
    assert rule is not None and rule.name == name
    assert rule.text(seen)
    assert first_mistake(l06.INTERRUPTED_SAVE_MISTAKES, GOOD_INTERRUPTED) is None
    assert set(INTERRUPTED_RULE_CASES) == rule_names(l06.INTERRUPTED_SAVE_MISTAKES)


def good_resume():
    config = {"dtype": "float16", "fp32_regions": []}
    optimizer = {"state": {0: {"exp_avg": torch.tensor([0.5])}}, "param_groups": [{"params": [0]}]}
    scaler = {"scale": 2048.0, "_growth_tracker": 2}
    saved = {
        "params": {"w": torch.ones(2)},
        "optimizer": optimizer,
        "scaler": scaler,
        "rng": l06.capture_rng(),
    }
    return l06.ResumeSeen(
        config,
        saved,
        (l06.STEPS_BEFORE, dict(config)),
        {"w": torch.ones(2)},
        copy.deepcopy(optimizer["state"]),
        dict(scaler),
        {"scale": 1024.0, "_growth_tracker": 0},
        saved["rng"],
        {"optimizer": optimizer, "scaler": scaler},
        [{"weights_only": True}],
        [torch.tensor(1.0)],
        [torch.tensor(1.0)],
        {"w": torch.ones(2)},
        {"w": torch.ones(2)},
    )


def other_torch_rng(rng):
    generator = torch.Generator().manual_seed(12345)
    return {**rng, "torch": generator.get_state()}


RESTORE_RULE_CASES = {
    "not the pair (step, config)": lambda s: dict(result=6),
    "step counter lost": lambda s: dict(result=(0, s.config)),
    "(config, step) in the wrong order": lambda s: dict(result=(s.config, 6)),
    "config lost": lambda s: dict(result=(6, {})),
    "weights not restored": lambda s: dict(params={"w": torch.zeros(2)}),
    "optimizer lost the model's parameters": lambda s: dict(optimizer_has_the_parameters=False),
    "optimizer state saved but not restored": lambda s: dict(optimizer_state={}),
    "optimizer state not saved": lambda s: dict(optimizer_state={}, payload={"scaler": s.saved["scaler"]}),
    "only part of the GradScaler state": lambda s: dict(scaler={"scale": 2048.0, "_growth_tracker": 0}),
    "GradScaler state saved but not restored": lambda s: dict(scaler=s.fresh_scaler),
    "GradScaler state not saved": lambda s: dict(scaler=s.fresh_scaler, payload={"x": 1}),
    "RNG not restored": lambda s: dict(rng=other_torch_rng(s.rng)),
}


@pytest.mark.parametrize("name", RESTORE_RULE_CASES)
def test_each_restore_rule_recognises_its_case(name):
    good = good_resume()
    seen = replace(good, **RESTORE_RULE_CASES[name](good))
    rule = first_mistake(l06.RESTORE_MISTAKES, seen)
    assert rule is not None and rule.name == name
    assert rule.text(seen)
    assert first_mistake(l06.RESTORE_MISTAKES, good) is None
    assert set(RESTORE_RULE_CASES) == rule_names(l06.RESTORE_MISTAKES)


RUN_RULE_CASES = {
    "the resumed run diverges": dict(resumed_losses=[torch.tensor(2.0)]),
    "the parameters differ": dict(final_params={"w": torch.zeros(2)}),
    "weights_only=False": dict(loads=[{"weights_only": False}]),
    "weights_only not given": dict(loads=[{"map_location": "cpu"}]),
}


@pytest.mark.parametrize("name", RUN_RULE_CASES)
def test_each_run_rule_recognises_its_case(name):
    seen = replace(good_resume(), **RUN_RULE_CASES[name])
    rule = first_mistake(l06.RUN_MISTAKES, seen)
    assert rule is not None and rule.name == name
    assert rule.text(seen)
    assert first_mistake(l06.RUN_MISTAKES, good_resume()) is None
    assert set(RUN_RULE_CASES) == rule_names(l06.RUN_MISTAKES)


@pytest.mark.parametrize(
    "value, step",
    [
        (6, 6),
        (6.0, 6),
        (np.int64(6), 6),
        (torch.tensor(6), 6),
        (torch.tensor([6]), 6),
        (6.5, None),
        (True, None),
        ("6", None),
        (None, None),
        (float("nan"), None),
        (float("inf"), None),
        (torch.tensor([6, 6]), None),
    ],
)
def test_as_step_reads_whole_numbers_only(value, step):
    assert l06._as_step(value) == step


# ------------------------------------------- correct answers written differently, and more natural mistakes


def save_with_pathlib(path, model, optimizer, scaler, step, config):
    import pathlib

    target = pathlib.Path(path)
    temporary = target.with_name(target.name + ".partial")
    try:
        torch.save(_payload(model, optimizer, scaler, step, config), temporary)
        temporary.replace(target)  # Path.replace is os.replace
    finally:
        temporary.unlink(missing_ok=True)


def save_with_named_temporary_file(path, model, optimizer, scaler, step, config):
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile(dir=folder, delete=False) as handle:
        try:
            torch.save(_payload(model, optimizer, scaler, step, config), handle)
        except BaseException:
            handle.close()
            os.unlink(handle.name)
            raise
    try:
        os.replace(handle.name, path)
    except BaseException:
        os.unlink(handle.name)
        raise


def _moved_by(move):
    def save_checkpoint(path, model, optimizer, scaler, step, config):
        temporary = str(path) + ".tmp"
        try:
            torch.save(_payload(model, optimizer, scaler, step, config), temporary)
            move(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise

    return save_checkpoint


@pytest.mark.parametrize(
    "variant, mover",
    [
        (save_with_pathlib, "os.replace"),
        (save_with_named_temporary_file, "os.replace"),
        (_moved_by(lambda a, b: os.replace(a, b)), "os.replace"),
        (_moved_by(os.replace), "one rename (os.replace or os.rename)"),  # as after `from os import replace`
        (_moved_by(lambda a, b: os.rename(a, b)), "os.rename"),
        (_moved_by(lambda a, b: shutil.move(a, b)), "os.rename"),
    ],
)
def test_save_check_accepts_correct_variants_and_names_their_move(variant, mover):
    result = check_save_checkpoint(variant)
    assert result.passed, result.message
    assert f"arrives by {mover}" in result.message
    if mover == "os.rename":
        assert "os.replace is the portable call" in result.message and "by os.replace" not in result.message


def save_remove_then_rename(path, model, optimizer, scaler, step, config):
    temporary = str(path) + ".tmp"
    try:
        torch.save(_payload(model, optimizer, scaler, step, config), temporary)
        if os.path.exists(path):
            os.remove(path)  # a crash right here leaves no checkpoint at all
        os.rename(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def save_swallowing_everything(path, model, optimizer, scaler, step, config):
    temporary = str(path) + ".tmp"
    try:
        torch.save(_payload(model, optimizer, scaler, step, config), temporary)
    except BaseException:
        os.remove(temporary)
        raise
    try:
        os.replace(temporary, path)
    except:  # noqa: E722  (a bare except: catches even the end of the process)
        os.remove(temporary)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (save_remove_then_rename, "A crash between two calls leaves no checkpoint"),
        (save_swallowing_everything, "hid a failed rename"),
    ],
)
def test_save_check_names_new_mistakes(wrong, words):
    result = check_save_checkpoint(wrong)
    assert not result.passed and result.status == "failed", result.message
    assert words in result.message, result.message
    if wrong is save_remove_then_rename:
        assert "(os.remove(path))" in result.message


GOOD_CRASH = l06.SaveSeen("/run/run.ckpt", OLD, dict(OLD), outcome="raised")
CRASH_RULE_CASES = {
    "removed the old checkpoint before the rename": dict(after=dict(BEFORE), removes=["/run/run.ckpt"]),
    "changed the old checkpoint before the rename": dict(after={**BEFORE, "run.ckpt": b"copied"}),
    "hid the failed rename": dict(outcome="returned"),
}


@pytest.mark.parametrize("name", CRASH_RULE_CASES)
def test_each_crash_before_move_rule_recognises_its_case(name):
    seen = replace(GOOD_CRASH, **CRASH_RULE_CASES[name])
    rule = first_mistake(l06.CRASH_BEFORE_MOVE_MISTAKES, seen)
    assert rule is not None and rule.name == name
    assert rule.text(seen)
    assert first_mistake(l06.CRASH_BEFORE_MOVE_MISTAKES, GOOD_CRASH) is None
    assert set(CRASH_RULE_CASES) == rule_names(l06.CRASH_BEFORE_MOVE_MISTAKES)


@pytest.mark.parametrize(
    "table",
    [
        "SAVE_MISTAKES",
        "WEIGHTS_ONLY_HINTS",
        "INTERRUPTED_SAVE_MISTAKES",
        "CRASH_BEFORE_MOVE_MISTAKES",
        "RESTORE_MISTAKES",
        "RUN_MISTAKES",
    ],
)
def test_each_rule_table_is_a_list_of_named_rules(table):
    """Each rule is a module-level name (a test can call it on its own), so the table reads as a list of names."""
    named = {id(value) for name, value in vars(l06).items() if not name.isupper()}
    assert all(id(rule) in named for rule in getattr(l06, table))


def test_same_state_is_bitwise_and_scan_payload_looks_everywhere():
    """06.2 compares states bit for bit (dtype and shape included) and finds a part nested under any key."""
    a = {"w": torch.ones(2), "steps": [1, (2.0, torch.zeros(1))]}
    assert l06.same_state(a, copy.deepcopy(a))
    assert not l06.same_state(a, {"w": torch.ones(2, dtype=torch.float64), "steps": a["steps"]})
    assert not l06.same_state(a, {"w": torch.ones(2) + 2**-20, "steps": a["steps"]})
    assert not l06.same_state({"x": 1}, {"x": 1, "y": 2})
    nested = {"run": [{"parts": ({"param_groups": [], "state": {}},)}]}
    assert l06.scan_payload(nested, lambda item: isinstance(item, dict) and "param_groups" in item)
    assert not l06.scan_payload(nested, lambda item: isinstance(item, dict) and "_growth_tracker" in item)


def test_read_any_payload_reads_an_unsafe_file_and_gives_none_for_junk(tmp_path):
    unsafe, junk = tmp_path / "unsafe.pt", tmp_path / "junk.pt"
    torch.save({"opt": torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)}, unsafe)
    junk.write_bytes(b"not a checkpoint")
    assert isinstance(l06.read_any_payload(unsafe)["opt"], torch.optim.SGD)
    assert l06.read_any_payload(junk) is None


def test_each_weights_only_hint_reads_torch_2_14_wording():
    blocked = "unsupported GLOBAL posix.system whose module posix is blocked"
    assert first_mistake(l06.WEIGHTS_ONLY_HINTS, blocked).name == "whole objects"


def load_with_package_rng(path, model, optimizer, scaler):
    from amp_lessons.l06_checkpoint_and_rollback.checkpoint import restore_rng

    payload = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    scaler.load_state_dict(payload["scaler"])
    restore_rng(payload["rng"])
    return [torch.tensor(payload["step"]), dict(payload["config"])]  # a list and a tensor step work too


def save_with_package_rng(path, model, optimizer, scaler, step, config):
    from amp_lessons.l06_checkpoint_and_rollback.checkpoint import capture_rng

    payload = {
        "step": np.int64(step).item(),
        "config": config,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": capture_rng(),
    }
    _atomic(payload, path)


@pytest.mark.parametrize(
    "save, load",
    [
        (save_with_package_rng, load_with_package_rng),
        (save_with_pathlib, make_load()),
        (save_with_named_temporary_file, make_load()),
    ],
)
def test_resume_check_accepts_correct_variants(save, load):
    result = check_resume(save, load)
    assert result.passed, result.message


@pytest.mark.parametrize(
    "step, words",
    [
        ("6", "Step counter lost: load_checkpoint returned step '6'"),
        ("step 6", "Step counter lost"),
        (7, "Step counter lost"),
        (5.5, "Step counter lost"),
    ],
)
def test_resume_check_rejects_a_step_that_is_not_the_number(step, words):
    result = check_resume(make_save(), make_load(step=step))
    assert not result.passed and words in result.message, result.message


def test_checks_are_fast():
    import time

    for check, args in (
        (check_save_checkpoint, (sol("save_checkpoint"),)),
        (check_resume, (sol("save_checkpoint"), sol("load_checkpoint"))),
    ):
        times = []
        for _ in range(2):  # the better of two runs: a shared CI machine can stall one of them
            start = time.perf_counter()
            assert check(*args).passed
            times.append(time.perf_counter() - start)
        assert min(times) < 2.0, (check.__name__, times)


# ------------------------------------------- a class's answers: more styles that are right, more mistakes


def _rng_in_learner_style():
    """random.getstate() kept as the tuple it is; NumPy's state as the dict get_state(legacy=False) gives."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all(),
    }


def _class_payload(model, optimizer, scaler, step, config):
    return {
        "step": step,
        "config": config,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": _rng_in_learner_style(),
    }


def save_bytes_then_write(path, model, optimizer, scaler, step, config):
    import io

    buffer = io.BytesIO()
    torch.save(_class_payload(model, optimizer, scaler, step, config), buffer)
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def save_in_a_temporary_directory(path, model, optimizer, scaler, step, config):
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as folder:
        temporary = os.path.join(folder, "checkpoint.pt")
        torch.save(_class_payload(model, optimizer, scaler, step, config), temporary)
        os.replace(temporary, path)  # a folder inside the checkpoint's: the same file system


def save_pathlib_with_suffix_and_prints(path, model, optimizer, scaler, step, config):
    import pathlib

    path = pathlib.Path(path)
    temporary = path.with_suffix(".tmp")
    print(f"saving step {step} to {path}")
    try:
        with temporary.open("wb") as handle:
            torch.save(_class_payload(model, optimizer, scaler, step, config), handle)
        temporary.replace(path)
    except Exception:
        temporary.unlink(missing_ok=True)
        raise
    print("saved")


def save_wrapping_the_error(path, model, optimizer, scaler, step, config):
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        torch.save(_class_payload(model, optimizer, scaler, step, config), temporary)
    except OSError as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise RuntimeError(f"checkpoint {path} not written") from error
    os.replace(temporary, path)


def save_verified_before_the_swap(path, model, optimizer, scaler, step, config):
    temporary = str(path) + ".tmp"
    try:
        torch.save(_class_payload(model, optimizer, scaler, step, config), temporary)
        torch.load(temporary, weights_only=True)  # read it back before it replaces the old one
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def load_in_learner_style(path, model, optimizer, scaler):
    checkpoint = torch.load(path, map_location=next(model.parameters()).device, weights_only=True)
    for name, target in (("model", model), ("optimizer", optimizer), ("scaler", scaler)):
        target.load_state_dict(checkpoint[name])
    rng = checkpoint["rng"]
    random.setstate(rng["python"])
    numpy_state = rng["numpy"]
    numpy_state["state"]["key"] = np.asarray(numpy_state["state"]["key"], dtype=np.uint32)
    np.random.set_state(numpy_state)
    torch.random.set_rng_state(rng["torch"])
    if torch.cuda.is_available() and rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    model.train()
    return int(checkpoint["step"]), dict(checkpoint["config"])


CLASS_SAVES = [
    save_bytes_then_write,
    save_in_a_temporary_directory,
    save_pathlib_with_suffix_and_prints,
    save_wrapping_the_error,
    save_verified_before_the_swap,
]


@pytest.mark.parametrize("save", CLASS_SAVES, ids=lambda f: f.__name__)
def test_class_saves_written_differently_pass_both_checks(save):
    result = check_save_checkpoint(save)
    assert result.passed, result.message
    result = check_resume(save, load_in_learner_style)
    assert result.passed, result.message


def _atomic_class(payload, path):
    temporary = path + ".tmp"
    try:
        torch.save(payload, temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def save_temporary_in_system_tmp(path, model, optimizer, scaler, step, config):
    import tempfile

    descriptor, temporary = tempfile.mkstemp(suffix=".pt")  # no dir=: /tmp, maybe another file system
    os.close(descriptor)
    try:
        torch.save(_class_payload(model, optimizer, scaler, step, config), temporary)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def save_backup_then_write(path, model, optimizer, scaler, step, config):
    if os.path.exists(path):
        shutil.copyfile(path, path + ".bak")  # "a backup makes it safe"
    torch.save(_class_payload(model, optimizer, scaler, step, config), path)


def save_with_torch_version(path, model, optimizer, scaler, step, config):
    payload = _class_payload(model, optimizer, scaler, step, config)
    payload["torch_version"] = torch.__version__
    _atomic_class(payload, path)


def save_warning_on_oserror(path, model, optimizer, scaler, step, config):
    temporary = path + ".tmp"
    try:
        torch.save(_class_payload(model, optimizer, scaler, step, config), temporary)
        os.replace(temporary, path)
    except OSError as error:
        print("warning: checkpoint failed", error)
        if os.path.exists(temporary):
            os.remove(temporary)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (save_temporary_in_system_tmp, "not next to the checkpoint"),
        (save_backup_then_write, "torch.save wrote straight into `path`"),
        (save_with_torch_version, "store str(torch.__version__)"),
        (save_warning_on_oserror, "hid a failed write"),
    ],
)
def test_class_save_mistakes_are_named(wrong, words):
    result = check_save_checkpoint(wrong)
    assert not result.passed and result.status == "failed", result.message
    assert words in result.message, result.message


def load_returning_config_first(path, model, optimizer, scaler):
    step, config = load_in_learner_style(path, model, optimizer, scaler)
    return config, step


def load_with_assign(path, model, optimizer, scaler):
    step, config = load_in_learner_style(path, model, optimizer, scaler)
    model.load_state_dict(torch.load(path, weights_only=True)["model"], assign=True)  # new tensors
    return step, config


def load_then_reseed(path, model, optimizer, scaler):
    step, config = load_in_learner_style(path, model, optimizer, scaler)
    torch.manual_seed(step)  # "seeding with the step makes the resume reproducible"
    np.random.seed(step)
    random.seed(step)
    return step, config


def load_returning_the_next_step(path, model, optimizer, scaler):
    step, config = load_in_learner_style(path, model, optimizer, scaler)
    return step + 1, config


def load_then_fresh_scaler(path, model, optimizer, scaler):
    step, config = load_in_learner_style(path, model, optimizer, scaler)
    scaler.__init__("cpu")  # "a resumed run starts its scaler afresh"
    return step, config


def load_then_halve_lr(path, model, optimizer, scaler):
    step, config = load_in_learner_style(path, model, optimizer, scaler)
    for group in optimizer.param_groups:
        group["lr"] = config["lr"] / 2  # a "warm restart"
    return step, config


@pytest.mark.parametrize(
    "load, words",
    [
        (load_returning_config_first, "returned (config, step): the pair is the other way round"),
        (load_with_assign, "the optimizer no longer holds the model's parameters"),
        (load_then_reseed, "RNG not restored"),
        (load_returning_the_next_step, "returned step 7"),
        (load_then_fresh_scaler, "GradScaler state saved but not restored"),
        (load_then_halve_lr, "diverges from the uninterrupted one"),
    ],
)
def test_class_load_mistakes_are_named(load, words):
    result = check_resume(save_bytes_then_write, load)
    assert not result.passed and result.status == "failed", result.message
    assert words in result.message, result.message


def test_a_load_that_leaves_objects_unable_to_train_is_named_not_a_checker_bug():
    def load_to_half(path, model, optimizer, scaler):
        step, config = load_in_learner_style(path, model, optimizer, scaler)
        optimizer.param_groups[0]["params"] = [torch.zeros(1, requires_grad=True)]  # params the model lacks
        return step, config

    result = check_resume(save_bytes_then_write, load_to_half)
    assert result.status == "failed", result.message
    assert "no longer holds the model's parameters" in result.message


def test_the_temporary_folder_rule_reads_folders_inside_the_checkpoints_as_the_same():
    inside = replace(GOOD_SAVE, saves=["/run/tmpdir/x"], moves=[("/run/tmpdir/x", "/run/run.ckpt")])
    sibling = replace(GOOD_SAVE, saves=["/running/x"], moves=[("/running/x", "/run/run.ckpt")])
    assert first_mistake(l06.SAVE_MISTAKES, inside) is None
    assert first_mistake(l06.SAVE_MISTAKES, sibling).name == "temporary file in another folder"


# ----------------------------------- issue 19: 06.1 looks inside the file and checks each part by value


def _without(*parts):
    """An atomic save whose payload lacks ``parts`` ("scaler", "python", ...; "all but model and step")."""

    def save(path, model, optimizer, scaler, step, config):
        payload = _payload(model, optimizer, scaler, step, config)
        for part in parts:
            if part in payload:
                del payload[part]
            else:
                del payload["rng"][part]
        _atomic(payload, path)

    save.__name__ = "save_without_" + "_".join(parts)
    return save


def save_only_model_and_step(path, model, optimizer, scaler, step, config):
    _atomic({"model": model.state_dict(), "step": step}, path)


def save_stale_model(path, model, optimizer, scaler, step, config):
    payload = _payload(model, optimizer, scaler, step, config)
    payload["model"] = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}  # not the weights
    _atomic(payload, path)


def save_rng_drawn_after(path, model, optimizer, scaler, step, config):
    random.random()  # the state saved is not the state the run is in
    payload = _payload(model, optimizer, scaler, step, config)
    _atomic(payload, path)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_without("scaler"), "holds no GradScaler state"),
        (_without("python"), "does not hold Python's RNG state"),
        (_without("numpy"), "does not hold NumPy's RNG state"),
        (_without("torch"), "does not hold torch's RNG state"),
        (_without("config"), "does not hold the run's config"),
        (_without("optimizer"), "holds no optimizer state"),
        (save_only_model_and_step, "holds no optimizer state"),
        (save_only_model_and_step, "Also missing: the GradScaler state, the config, Python's RNG state"),
        (save_stale_model, "does not hold the model's weights"),
        (save_rng_drawn_after, "does not hold Python's RNG state"),
    ],
    ids=range(10),
)
def test_save_check_looks_inside_the_file(wrong, words):
    result = check_save_checkpoint(wrong)
    assert result.status == "failed" and words in result.message, result.message


def save_nested_with_json_config(path, model, optimizer, scaler, step, config):
    import json

    state = {
        "weights": {"net": model.state_dict()},
        "training": {"opt": optimizer.state_dict(), "amp": scaler.state_dict(), "at": step},
        "meta": json.dumps(config),
        "generators": [random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()],
    }
    tmp = os.path.join(os.path.dirname(path), ".writing-" + os.path.basename(path))
    try:
        with open(tmp, "wb") as handle:
            torch.save(state, handle)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_rng_as_int_tensors(path, model, optimizer, scaler, step, config):
    version, internal, gauss = random.getstate()
    payload = {
        "step": torch.tensor(step),
        "config": {**config},
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "scaler": scaler.state_dict(),
        "python_rng": {"version": version, "state": torch.tensor(internal), "gauss": gauss},
        "numpy_rng": torch.from_numpy(np.random.get_state()[1].astype(np.int64)),
        "torch_rng": torch.get_rng_state().clone(),
    }
    _atomic(payload, path)


@pytest.mark.parametrize(
    "variant",
    [save_nested_with_json_config, save_rng_as_int_tensors, save_with_package_rng],
    ids=lambda f: f.__name__,
)
def test_save_check_accepts_complete_files_in_other_shapes(variant):
    result = check_save_checkpoint(variant)
    assert result.passed, result.message
