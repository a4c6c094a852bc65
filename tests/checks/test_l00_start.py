"""Lesson 00's warm-up check: the answer passes, the stub is "not done", each first mistake is named."""

import pytest
import torch

from amp_lessons.checks import check_autocast_matmul
from amp_lessons.checks.harness import NOT_DONE


def right(a, b, dtype):
    with torch.autocast(device_type=a.device.type, dtype=dtype):
        return a @ b


def stub(a, b, dtype):
    raise NotImplementedError("Exercise: replace this line with your code")


def no_autocast(a, b, dtype):
    return a @ b


def cast_by_hand(a, b, dtype):
    return a.to(dtype) @ b.to(dtype)


def fixed_dtype(a, b, dtype):
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        return a @ b


def wrong_device_type(a, b, dtype):
    with torch.autocast(device_type="cuda", dtype=dtype):
        return a @ b


def transposed(a, b, dtype):
    with torch.autocast(device_type=a.device.type, dtype=dtype):
        return (b.T @ a.T).T * 2


def left_on(a, b, dtype):
    context = torch.autocast(device_type="cpu", dtype=dtype)
    context.__enter__()
    return a @ b


def test_the_answer_passes():
    assert check_autocast_matmul(right).passed


def test_the_stub_is_not_done():
    assert check_autocast_matmul(stub).status == NOT_DONE


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")
@pytest.mark.parametrize(
    "wrong, named",
    [
        (no_autocast, "still float32"),
        (cast_by_hand, "casts by hand"),
        (fixed_dtype, "pass the `dtype` argument"),
        (wrong_device_type, "device_type match"),
        (transposed, "values are not `a @ b`"),
        (left_on, "still switched on"),
    ],
)
def test_each_mistake_is_named(wrong, named):
    result = check_autocast_matmul(wrong)
    assert not result.passed and named in result.message


@pytest.mark.parametrize("junk", [None, "right", 3, lambda a: a, lambda a, b, dtype: "tensor"])
def test_junk_never_raises(junk):
    assert not check_autocast_matmul(junk).passed
