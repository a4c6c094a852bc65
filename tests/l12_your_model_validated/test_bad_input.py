"""Every unusable recipe or argument: a clear message, exit code 2, and no traceback from inside the package."""

import pytest
import torch

from amp_lessons.l12_your_model_validated import UsageError, validate
from amp_lessons.l12_your_model_validated.command import main


def run(capsys, *arguments):
    code = main([str(a) for a in arguments] + ["--no-progress", "--steps", "2", "--dtypes", "bf16"])
    out, err = capsys.readouterr()
    return code, out + err


def assert_unusable(code, text, *words):
    assert code == 2, text
    for word in words:
        assert word in text, text
    assert "amp_lessons/l12" not in text and "amp_lessons/l0" not in text, text  # no frame of the package


def test_a_missing_function(write_recipe, tmp_path, capsys):
    code, text = run(capsys, write_recipe(drop=("loss_fn",)), "--out", tmp_path / "r")
    assert_unusable(code, text, "has no `loss_fn()`", "docs/validate.md")


def test_a_recipe_that_raises_shows_only_the_learners_frames(write_recipe, tmp_path, capsys):
    path = write_recipe(
        """
        def load_weights():
            raise ValueError("the checkpoint file is missing")


        def build_model():
            load_weights()
        """
    )
    code, text = run(capsys, path, "--out", tmp_path / "r")
    assert_unusable(
        code,
        text,
        "`build_model()`",
        "Traceback (your code only)",
        "in load_weights",
        "ValueError: the checkpoint file is missing",
    )
    assert str(path) in text


def test_a_recipe_that_fails_to_import(write_recipe, tmp_path, capsys):
    code, text = run(capsys, write_recipe("import a_module_nobody_has\n"), "--out", tmp_path / "r")
    assert_unusable(code, text, "Importing the recipe", "ModuleNotFoundError")


# outputs_of returning something the protocol cannot judge: (its body, what the message must say)
WRONG_OUTPUTS = {
    "one row for the batch": (
        "model(inputs)[:1]",
        ("shape (1, 3)", "first axis of the outputs must be the batch"),
    ),
    "no class axis": ("model(inputs)[:, 0]", ("a classification recipe needs scores", "task = 'regression'")),
    "float64": ("model(inputs).double()", ("float64", "the reference must be FP32")),
    "integer decisions": ("model(inputs).argmax(1, keepdim=True)", ("torch.int64", "must be floating point")),
    "a tuple": ("(model(inputs),)", ("not a tensor", "define outputs_of")),
}


@pytest.mark.parametrize("case", WRONG_OUTPUTS)
def test_outputs_of_the_wrong_shape_or_dtype(case, write_recipe, tmp_path, capsys):
    body, expected = WRONG_OUTPUTS[case]
    recipe = write_recipe(f"def outputs_of(model, inputs):\n    return {body}\n")
    code, text = run(capsys, recipe, "--out", tmp_path / "r")
    assert_unusable(code, text, *expected)


def test_an_empty_evaluation_set(write_recipe, tmp_path, capsys):
    code, text = run(
        capsys, write_recipe("def evaluation_batches():\n    return []\n"), "--out", tmp_path / "r"
    )
    assert_unusable(code, text, "the evaluation set is empty")


def test_an_evaluation_set_that_changes(write_recipe, tmp_path, capsys):
    extra = "def evaluation_batches():\n    return [(torch.randn(16, 8), Y[:16])]\n"
    code, text = run(capsys, write_recipe(extra), "--out", tmp_path / "r")
    assert_unusable(code, text, "different data on its second call")


def test_a_non_finite_reference(write_recipe, tmp_path, capsys):
    extra = "X[17, 3] = float('inf')\n"
    code, text = run(capsys, write_recipe(extra), "--out", tmp_path / "r")
    assert_unusable(code, text, "The reference is not finite at sample 17: fix FP32 first")


def test_a_reference_below_the_minimum_quality(write_recipe, tmp_path, capsys):
    extra = "criteria = Criteria(atol=0.05, rtol=0.05, min_quality=0.99, application='a test')\n"
    code, text = run(capsys, write_recipe(extra), "--out", tmp_path / "r")
    assert_unusable(code, text, "below the criteria's minimum 99.0%", "Fix FP32 first")


def test_a_model_that_does_not_fit(write_recipe, tmp_path, capsys):
    extra = (
        "def build_model():\n"
        "    raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB')\n"
    )
    code, text = run(capsys, write_recipe(extra), "--out", tmp_path / "r")
    assert_unusable(code, text, "The model does not fit", "smaller batches", "--device cpu")


def test_a_recipe_path_that_does_not_exist(tmp_path, capsys):
    code, text = run(capsys, tmp_path / "no_such_recipe.py", "--out", tmp_path / "r")
    assert_unusable(code, text, "does not exist", "no_such_recipe.py")


def test_no_criteria_refuses_to_judge(write_recipe, tmp_path, capsys):
    code, text = run(capsys, write_recipe("del criteria\n"), "--out", tmp_path / "r")
    assert_unusable(code, text, "refuses to judge", "Criteria(", "BEFORE the trial")
    assert not (tmp_path / "r").exists()  # nothing ran, nothing written


def test_a_wrong_dtype_argument(write_recipe, tmp_path, capsys):
    code = main([str(write_recipe()), "--require", "fp8", "--out", str(tmp_path / "r")])
    assert_unusable(code, capsys.readouterr().err, "bf16/fp16")
    assert main(["--no-such-option"]) == 2


def test_an_earlier_report_is_never_overwritten(write_recipe, tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.json").write_text("{}", encoding="utf-8")
    code, text = run(capsys, write_recipe(), "--out", out)
    assert_unusable(code, text, "never overwritten", "--force")
    assert (out / "report.json").read_text(encoding="utf-8") == "{}"
    code, _ = run(capsys, write_recipe(), "--out", out, "--force")
    assert code == 0 and (out / "report.json").read_text(encoding="utf-8") != "{}"


def test_the_function_raises_a_usage_error_that_a_notebook_shows_without_frames(tmp_path):
    try:
        validate({"build_model": lambda: torch.nn.Linear(2, 2)}, out=tmp_path / "r")
    except UsageError as error:
        lines = error._render_traceback_()
        assert lines[0].startswith("RecipeError: The recipe the recipe dict has no `evaluation_batches()`")
        assert not any("File " in line for line in lines)
    else:
        raise AssertionError("no UsageError")


def test_the_course_cli_dispatches_validate(tmp_path, capsys):
    from amp_lessons.tools.cli import main as course_main

    assert course_main(["validate", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
