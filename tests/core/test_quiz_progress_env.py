"""Quiz grading, the progress record, the environment card and the doctor."""

import json
import os

import pytest
import torch

from amp_lessons import SetupError
from amp_lessons.core import environment, record
from amp_lessons.core.quiz import Question, Quiz
from amp_lessons.tools.doctor import run_doctor

QUIZ = Quiz(
    "demo",
    [Question("2+2?", ("3", "4"), 1, "Arithmetic."), Question("Sky?", ("blue", "green"), 0, "Rayleigh.")],
)


def test_quiz_feedback_shows_answer_and_explanation():
    right, text = QUIZ[0].feedback(1)
    assert right and "Arithmetic." in text
    wrong, text = QUIZ[0].feedback(0)
    assert not wrong and "The answer is “4”" in text and "Arithmetic." in text
    assert QUIZ[0].feedback("4")[0]
    assert "Choose one of the options" in QUIZ[0].feedback(7)[1]
    assert QUIZ.score([1, 1]) == 1
    assert "There are questions 1 to 2" in QUIZ.answer(5, 0)


def test_quiz_text_fallback_and_widget():
    text = str(QUIZ)
    assert "Q1. 2+2?" in text and "1) 4" in text and "quiz.answer" in text
    bundle = QUIZ._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert "application/vnd.jupyter.widget-view+json" in bundle
    form = QUIZ.widget()
    radio, button, result = form.children[2], form.children[3], form.children[4]
    button.click()
    assert "Pick an option" in result.value
    radio.value = 0
    button.click()
    assert "Not quite" in result.value


def test_bad_question_is_refused():
    with pytest.raises(ValueError):
        Question("?", ("only",), 0, "")
    with pytest.raises(ValueError):
        Question("?", ("a", "b"), 2, "")


def test_progress_atomic_and_corrupt_record(private_progress):
    record.record("ex1", False, "failed", "wrong")
    record.record("ex1", True, "passed", "ok")
    data = json.loads(private_progress.read_text())
    assert data["exercises"]["ex1"]["passed"] and data["exercises"]["ex1"]["attempts"] == 2
    left = sorted(p.name for p in private_progress.parent.iterdir())
    assert left in (["progress.json"], ["progress.json", "progress.json.lock"])  # no temp files left
    private_progress.write_text("{not json")
    warnings = []
    assert record.load(warn=warnings.append)["exercises"] == {}
    assert "could not be read" in warnings[0]
    assert any(p.name.startswith("progress.json.corrupt-") for p in private_progress.parent.iterdir())
    record.record("ex2", True, "passed", "ok")  # a fresh record starts
    assert list(json.loads(private_progress.read_text())["exercises"]) == ["ex2"]


def test_progress_can_be_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv("AMP_LESSONS_PROGRESS_FILE", "off")
    record.record("ex", True, "passed", "ok")
    assert record.progress_path() is None


def test_setup_seeds_and_probes():
    env = environment.setup(seed=3)
    first = torch.rand(3)
    env2 = environment.setup(seed=3)
    assert torch.equal(first, torch.rand(3))
    assert env2.device.type in ("cpu", "cuda")
    assert set(env.autocast) == {"float16", "bfloat16"}
    assert torch.bfloat16 in env.autocast_dtypes  # CPU and every supported GPU build run BF16 autocast
    assert env.grad_scaler[0]
    assert "Environment card" in str(env) and "<table>" in env._repr_html_()


def test_device_override(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_DEVICE", "cpu")
    assert environment.pick_device().type == "cpu"
    monkeypatch.setenv("AMP_LESSONS_DEVICE", "tpu9")
    with pytest.raises(SetupError, match="not a device"):
        environment.pick_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="only meaningful without a GPU")
def test_require_cuda_fails_loudly_without_gpu(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_REQUIRE_CUDA", "1")
    with pytest.raises(SetupError, match="AMP_LESSONS_REQUIRE_CUDA=1"):
        environment.setup()


@pytest.mark.skipif(os.environ.get("AMP_LESSONS_REQUIRE_CUDA") != "1", reason="GPU runner only")
def test_gpu_runner_really_uses_the_gpu():
    assert environment.setup().device.type == "cuda"


def test_torch_version_parsing():
    assert environment.torch_version_tuple("2.14.1+cu130") == (2, 14)
    assert environment.torch_version_tuple("2.4.0a0") == (2, 4)


def test_doctor_reports_ready_here():
    lines = []
    code = run_doctor(out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert "READY" in text and "Environment card" in text
