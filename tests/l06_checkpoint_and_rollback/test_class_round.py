"""Lesson 06, a class round (issue 19): right answers written unlike the solution, and natural wrong answers
the other tests do not cover, each named by its own mistake.

Nothing wrong found for 06.2: the right answers pass and every wrong one is named.
"""

import os
import random

import numpy as np
import pytest
import torch
from notebook_code import solution

from amp_lessons.l06_checkpoint_and_rollback.check import check_resume as R

LESSON = "06_checkpoint_and_rollback.ipynb"
S, L = solution(LESSON, "save_checkpoint"), solution(LESSON, "load_checkpoint")


def r_save_flat(path, model, optimizer, scaler, step, config):
    st = np.random.get_state()
    payload = {
        "model": model.state_dict(),
        "opt": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "step": step,
        "config": config,
        "py": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "np": [st[0], st[1].tolist(), st[2], st[3], st[4]],
        "torch": torch.random.get_rng_state(),
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def r_load_flat(path, model, optimizer, scaler):
    p = torch.load(path, weights_only=True)
    model.load_state_dict(p["model"])
    optimizer.load_state_dict(p["opt"])
    scaler.load_state_dict(p["scaler"])
    random.setstate((p["py"][0], tuple(p["py"][1]), p["py"][2]))
    np.random.set_state((p["np"][0], np.asarray(p["np"][1], dtype=np.uint32), *p["np"][2:]))
    torch.random.set_rng_state(p["torch"])
    return int(p["step"]), dict(p["config"])


def r_load_rng_first(path, model, optimizer, scaler):
    p = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    version, internal, gauss = p["rng"]["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = p["rng"]["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(p["rng"]["torch"])
    for obj, key in ((model, "model"), (optimizer, "optimizer"), (scaler, "scaler")):
        obj.load_state_dict(p[key])
    return p["step"], p["config"]


def _wrap(**kw):
    def load(path, model, optimizer, scaler):
        p = torch.load(path, map_location="cpu", weights_only=True)
        if kw.get("new_scaler"):
            scaler = torch.amp.GradScaler("cpu")
        if kw.get("new_opt"):
            optimizer = type(optimizer)(
                model.parameters(), **{k: v for k, v in optimizer.defaults.items() if k in ("lr",)}
            )
        model.load_state_dict(p["model"])
        optimizer.load_state_dict(p["optimizer"])
        scaler.load_state_dict(p["scaler"])
        version, internal, gauss = p["rng"]["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, *rest = p["rng"]["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
        if not kw.get("no_torch_rng_but_seed"):
            torch.set_rng_state(p["rng"]["torch"])
        else:
            torch.manual_seed(p["step"])
        step = p["step"] + 1 if kw.get("plus_one") else p["step"]
        if kw.get("swapped"):
            return p["config"], step
        if kw.get("config_str"):
            return step, str(p["config"])
        return step, p["config"]

    return load


WRONG = {
    "w_new_scaler_rebound": (_wrap(new_scaler=True), "GradScaler state saved but not restored"),
    "w_new_optimizer_rebound": (_wrap(new_opt=True), "Optimizer state not restored"),
    "w_reseed_torch_from_step": (_wrap(no_torch_rng_but_seed=True), "torch's CPU generator"),
    "w_step_plus_one": (_wrap(plus_one=True), "returned step 7"),
    "w_pair_swapped": (_wrap(swapped=True), "the pair is the other way round"),
    "w_config_str": (_wrap(config_str=True), "The config came back as"),
}


@pytest.mark.parametrize(
    "pair", [(r_save_flat, r_load_flat), (S, r_load_rng_first)], ids=["flat keys", "rng first"]
)
def test_class_round_resume_right_answers_pass(pair):
    result = R(*pair)
    assert result.passed, result.message


@pytest.mark.parametrize("name", WRONG)
def test_class_round_resume_wrong_answers_are_named(name):
    load, words = WRONG[name]
    result = R(S, load)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
