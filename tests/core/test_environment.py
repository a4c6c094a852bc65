"""The environment card's float32-precision row and the FP32 pin: one precision API at a time, whichever the
installed torch has (torch >= 2.9: ``torch.backends.<backend>.<op>.fp32_precision``; older: the legacy
``allow_tf32`` / ``set_float32_matmul_precision``), so a learner's script that used either API first never
makes the card unreadable or the pin raise."""

import subprocess
import sys
import textwrap

import pytest
import torch

from amp_lessons.core import environment
from amp_lessons.core.environment import (
    LEGACY_FP32_SWITCHES,
    float32_matmul_settings,
    float32_settings_text,
    has_fp32_precision_api,
)
from amp_lessons.l08_amp_in_your_training_loop import fp32_reference_settings, real_tf32

NEW_API = has_fp32_precision_api()
needs_new_api = pytest.mark.skipif(not NEW_API, reason="torch.backends.fp32_precision arrived in torch 2.9")


def run_fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter (torch's precision switches are process-wide) and return stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_settings_come_from_exactly_one_api():
    settings = float32_matmul_settings()
    legacy = set(LEGACY_FP32_SWITCHES) & set(settings)
    new = {name for name in settings if name.endswith(".fp32_precision")}
    if NEW_API:
        assert not legacy and "torch.backends.cuda.matmul.fp32_precision" in new
        assert {
            "torch.backends.cudnn.conv.fp32_precision",
            "torch.backends.mkldnn.matmul.fp32_precision",
        } <= new
    else:
        assert legacy == set(LEGACY_FP32_SWITCHES) and not new
    assert not any("unreadable" in str(value) for value in settings.values())


def test_card_text_for_either_api():
    legacy = {
        "torch.get_float32_matmul_precision()": "high",
        "torch.backends.cuda.matmul.allow_tf32": True,
        "torch.backends.cudnn.allow_tf32": False,
    }
    text = float32_settings_text(legacy)
    assert "'high'" in text and "CUDA matmuls on" in text and "convolutions off" in text and "legacy" in text
    new = {
        "torch.backends.cuda.matmul.fp32_precision": "none",
        "torch.backends.cudnn.conv.fp32_precision": "tf32",
        "torch.backends.mkldnn.matmul.fp32_precision": "bf16",
    }
    text = float32_settings_text(new)
    assert "CUDA matmul ieee" in text and "cuDNN conv tf32" in text and "oneDNN (CPU) matmul bf16" in text
    assert "allow_tf32" not in text and "unreadable" not in text


def test_environment_card_shows_the_precision_row():
    card = environment.describe(torch.device("cpu"))
    rows = dict(card.rows())
    assert rows["float32 precision"] == float32_settings_text(card.float32_settings)
    assert "unreadable" not in str(card)


def test_pins_restore_what_was_there():
    before = float32_matmul_settings()
    with real_tf32() as loose:
        with fp32_reference_settings() as pinned:
            inside = float32_matmul_settings()
    assert float32_matmul_settings() == before and pinned == inside
    if NEW_API:
        assert loose["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
        assert loose["torch.backends.cudnn.conv.fp32_precision"] == "tf32"
        assert set(pinned.values()) == {"ieee"} and len(pinned) >= 4
    else:
        assert loose["torch.get_float32_matmul_precision()"] == "high"
        assert pinned["torch.get_float32_matmul_precision()"] == "highest"
        assert pinned["torch.backends.cudnn.allow_tf32"] is False


def test_pin_gives_true_fp32_on_the_cpu_after_medium():
    """``set_float32_matmul_precision("medium")`` lets oneDNN run CPU float32 matmuls in BF16 where the CPU has
    BF16 instructions; the pin undoes that on either torch (on a CPU without them both are FP32)."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(128, 128, generator=generator), torch.randn(128, 128, generator=generator)
    exact = a.double() @ b.double()

    def relative_error():
        return ((a @ b).double() - exact).abs().max().item() / exact.abs().max().item()

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")  # the legacy call, as a learner's script might make it
    try:
        loose = relative_error()
        with fp32_reference_settings():
            pinned = relative_error()
        after = relative_error()
    finally:
        torch.set_float32_matmul_precision(previous)
    assert pinned < 1e-5 and after == loose
    if environment.cpu_has_native_bf16():
        assert loose > 1e-4  # BF16 inside the "float32" matmul: about 8 mantissa bits


@needs_new_api
def test_a_script_that_used_the_new_api_first_keeps_the_card_and_the_pin_working():
    out = run_fresh(
        """
        import torch
        torch.backends.cuda.matmul.fp32_precision = "tf32"  # the learner's script, before the course's code
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        try:
            torch.backends.cuda.matmul.allow_tf32  # the legacy reader the card used to call
            print("legacy read: worked")
        except RuntimeError as error:
            print("legacy read: raised", "mix of the legacy and new APIs" in str(error))
        from amp_lessons.core.environment import describe, float32_matmul_settings
        from amp_lessons.l08_amp_in_your_training_loop import fp32_reference_settings, real_tf32
        card = str(describe(torch.device("cpu")))
        print("card unreadable:", "unreadable" in card)
        print("card row:", [line for line in card.splitlines() if "float32 precision" in line][0])
        before = float32_matmul_settings()
        with fp32_reference_settings() as pinned:
            print("pinned:", sorted(set(pinned.values())))
        with real_tf32() as loose:
            print("tf32:", loose["torch.backends.cudnn.conv.fp32_precision"])
        print("restored:", float32_matmul_settings() == before)
        print("learner's values kept:", torch.backends.cuda.matmul.fp32_precision,
              torch.backends.cudnn.conv.fp32_precision)
        """
    )
    assert "legacy read: raised True" in out  # mixing the APIs raises: why the course never reads legacy here
    assert "card unreadable: False" in out and "CUDA matmul tf32, cuDNN conv ieee" in out
    assert "pinned: ['ieee']" in out and "tf32: tf32" in out and "restored: True" in out
    assert "learner's values kept: tf32 ieee" in out


@needs_new_api
def test_a_script_that_used_the_legacy_api_first_still_reads_legacy_after_the_pin():
    out = run_fresh(
        """
        import torch
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = False
        from amp_lessons.core.environment import float32_matmul_settings
        from amp_lessons.l08_amp_in_your_training_loop import fp32_reference_settings
        print("seen:", float32_matmul_settings()["torch.backends.cuda.matmul.fp32_precision"],
              float32_matmul_settings()["torch.backends.mkldnn.matmul.fp32_precision"])
        with fp32_reference_settings():
            pass
        print("legacy after:", torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
        """
    )
    # set_float32_matmul_precision sets CUDA's and oneDNN's matmul precision on new torch
    assert "seen: tf32 tf32" in out
    assert "legacy after: high False" in out  # restored through the new API, readable through the old one


def test_reduced_matmul_switches_name_what_acts_on_each_device():
    from amp_lessons.core.environment import reduced_matmul_switches

    new = {
        "torch.backends.cuda.matmul.fp32_precision": "tf32",
        "torch.backends.cudnn.conv.fp32_precision": "tf32",
        "torch.backends.mkldnn.matmul.fp32_precision": "none",
    }
    assert reduced_matmul_switches(new, "cuda") == ["torch.backends.cuda.matmul.fp32_precision"]
    assert reduced_matmul_switches(new, "cpu") == []  # convolutions are not matmuls; TF32 acts on GPUs only
    new["torch.backends.mkldnn.matmul.fp32_precision"] = "bf16"
    assert reduced_matmul_switches(new, "cpu") == ["torch.backends.mkldnn.matmul.fp32_precision"]
    legacy = {
        "torch.get_float32_matmul_precision()": "highest",
        "torch.backends.cuda.matmul.allow_tf32": False,
        "torch.backends.cudnn.allow_tf32": True,
    }
    assert reduced_matmul_switches(legacy, "cuda") == [] and reduced_matmul_switches(legacy, "cpu") == []
    legacy["torch.get_float32_matmul_precision()"] = "medium"  # TF32 on NVIDIA GPUs, BF16 in oneDNN on CPUs
    assert reduced_matmul_switches(legacy, "cpu") == ["torch.get_float32_matmul_precision()"]
    assert "torch.get_float32_matmul_precision()" in reduced_matmul_switches(legacy, "cuda")
    assert reduced_matmul_switches(float32_matmul_settings(), "cuda") == []  # this test process: the defaults
