"""Lesson 00's warm-up check: the answer passes, the stub is "not done", each first mistake is named."""

import time

import pytest
import torch

from amp_lessons.checks import check_autocast_matmul
from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.core.autocast_state import autocast_enabled


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


# ----------------------------------- correct answers written differently, and more natural wrong answers


def right_amp_spelling(a, b, dtype):
    with torch.amp.autocast(a.device.type, dtype):
        return torch.matmul(a, b)


def right_ternary_device(a, b, dtype):
    device_type = "cuda" if a.is_cuda else "cpu"
    with torch.autocast(device_type=device_type, dtype=dtype, enabled=True):
        out = torch.mm(a, b)
    return out


def right_linear(a, b, dtype):
    with torch.autocast(device_type=a.device.type, dtype=dtype):
        result = torch.nn.functional.linear(a, b.t())
    return result


@pytest.mark.parametrize(
    "variant", [right_amp_spelling, right_ternary_device, right_linear], ids=lambda f: f.__name__
)
def test_correct_variants_pass(variant):
    result = check_autocast_matmul(variant)
    assert result.passed, result.message


def default_dtype(a, b, dtype):
    with torch.autocast(a.device.type):  # no dtype: CPU autocast's default is bfloat16
        return a @ b


def matmul_after_the_block(a, b, dtype):
    with torch.autocast(a.device.type, dtype=dtype):
        pass
    return a @ b


def cast_the_result(a, b, dtype):
    return (a @ b).to(dtype)


def always_half(a, b, dtype):
    return a.half() @ b.half()


def switched_off(a, b, dtype):
    with torch.autocast(a.device.type, dtype=dtype, enabled=False):
        return a @ b


def no_device_type(a, b, dtype):
    with torch.autocast(dtype=dtype):
        return a @ b


@pytest.mark.parametrize(
    "wrong, named",
    [
        (default_dtype, "pass the `dtype` argument"),
        (matmul_after_the_block, "still float32"),
        (cast_the_result, "casts by hand"),
        (always_half, "casts by hand"),
        (switched_off, "still float32"),
        (no_device_type, "raised an error: TypeError"),
    ],
    ids=["default dtype", "after the block", "cast result", "always half", "enabled=False", "no device"],
)
def test_more_mistakes_are_named(wrong, named):
    result = check_autocast_matmul(wrong)
    assert result.status == "failed" and named in result.message, result.message


# ----------------------------------- a review pass: more styles a class writes, and two more mistakes


def right_decorator(a, b, dtype):
    @torch.autocast(device_type=a.device.type, dtype=dtype)
    def product(x, y):
        return x @ y

    return product(a, b)


def right_einsum_with_prints(a, b, dtype):
    print("shapes", tuple(a.shape), tuple(b.shape))
    assert a.shape[1] == b.shape[0]
    with torch.autocast(str(a.device), dtype=dtype):
        return torch.einsum("ij,jk->ik", a, b)


def right_exit_stack_bmm(a, b, dtype):
    import contextlib

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type=a.device.type, dtype=dtype, cache_enabled=False))
        result = torch.bmm(a[None], b[None])[0]
    return result


@pytest.mark.parametrize(
    "variant", [right_decorator, right_einsum_with_prints, right_exit_stack_bmm], ids=lambda f: f.__name__
)
def test_review_correct_variants_pass(variant):
    assert check_autocast_matmul(variant).passed


def float_after_the_block(a, b, dtype):
    with torch.autocast(a.device.type, dtype=dtype):
        out = a @ b
    return out.float()


def outer_product_of_sums(a, b, dtype):
    with torch.autocast(a.device.type, dtype=dtype):
        return a.sum(1, keepdim=True) * b.sum(0, keepdim=True)


def entered_never_left(a, b, dtype):
    torch.autocast(a.device.type, dtype=dtype).__enter__()
    return a @ b


@pytest.mark.parametrize(
    "wrong, named",
    [
        (float_after_the_block, "cast the result back to float32 (float)"),
        (outer_product_of_sums, "The values are not `a @ b`"),
        (entered_never_left, "still switched on"),
    ],
    ids=["float() after", "not a matmul", "entered, never left"],
)
def test_review_mistakes_are_named(wrong, named):
    result = check_autocast_matmul(wrong)
    assert result.status == "failed" and named in result.message, result.message
    assert not autocast_enabled("cpu")


def test_the_check_is_fast_on_the_answer():
    check_autocast_matmul(right)
    started = time.perf_counter()
    check_autocast_matmul(right)
    assert time.perf_counter() - started < 2.0


# ----------------------------------- issue 19: judged by what the function does, on CPU and CUDA-labelled data


def right_noop_float(a, b, dtype):
    with torch.autocast(device_type=a.device.type, dtype=dtype):
        return a.float() @ b.float()  # the inputs are FP32 already: a no-op, not a hand cast


def right_to_own_device(a, b, dtype):
    b = b.to(a.device)
    with torch.autocast(a.device.type, dtype=dtype):
        return torch.matmul(a.to(torch.float32), b)


def right_is_cuda_branch(a, b, dtype):
    kind = "cuda" if a.is_cuda else "cpu"
    ctx = torch.autocast(kind, dtype=dtype)
    with ctx:
        product = a.matmul(b)
    return product


def right_device_of_b(a, b, dtype):
    with torch.autocast(device_type=b.device.type, dtype=dtype, cache_enabled=False):
        return a.mm(b.type(torch.float32))


@pytest.mark.parametrize(
    "variant",
    [right_noop_float, right_to_own_device, right_is_cuda_branch, right_device_of_b],
    ids=lambda f: f.__name__,
)
def test_no_op_casts_and_device_from_the_data_pass(variant):
    result = check_autocast_matmul(variant)
    assert result.passed, result.message


def hard_coded_cpu(a, b, dtype):
    with torch.autocast(device_type="cpu", dtype=dtype):
        return a @ b


def hard_coded_cpu_amp(a, b, dtype):
    with torch.amp.autocast("cpu", dtype=dtype):
        return torch.mm(a, b)


def hard_coded_cpu_result_to_device(a, b, dtype):
    with torch.autocast("cpu", dtype=dtype):
        out = a @ b
    return out.to(a.device)


def half_then_device(a, b, dtype):
    return (a.to(a.device).half() @ b.half()).to(dtype)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (hard_coded_cpu, "switched on autocast for the CPU"),
        (hard_coded_cpu_amp, "switched on autocast for the CPU"),
        (hard_coded_cpu_result_to_device, "switched on autocast for the CPU"),
        (half_then_device, "casts by hand (half, to)"),
    ],
    ids=["device_type='cpu'", "amp 'cpu'", "cpu, then .to(a.device)", "half then to"],
)
def test_a_hard_coded_device_type_is_caught(wrong, named):
    result = check_autocast_matmul(wrong)
    assert result.status == "failed" and named in result.message, result.message
    assert not autocast_enabled("cpu") and not autocast_enabled("cuda")
