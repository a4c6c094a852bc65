"""Lesson 05's checkers tried the way a class would: right answers written differently from the reference
pass, natural wrong answers fail with a message that names the actual mistake, and every check leaves the
kernel (autocast, hooks, tensor attributes) as it found it and answers in under 2 s."""

import contextlib
import time
import warnings

import pytest
import torch
from notebook_code import solution

from amp_lessons.core.autocast_state import autocast_enabled
from amp_lessons.l05_nan_debugging import cases as cases
from amp_lessons.l05_nan_debugging.check import check_first_nonfinite_module, check_texture_forward
from amp_lessons.l05_nan_debugging.debugging import global_hook_count, hook_count

LESSON = "05_nan_debugging.ipynb"


@pytest.fixture(autouse=True)
def quiet_cuda_warnings():
    """Several answers name 'cuda' on a machine without one; torch warns about it, which is the answer's
    business, not the test's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ----------------------------------------------------------------------------------------------- 05.1 right


def _watch(model, on_output):
    return [m.register_forward_hook(on_output(n)) for n, m in model.named_modules()]


def finder_one_shared_hook(model, inputs, dtype):
    """One hook for every module, names looked up by module; isinf|isnan; inference_mode; positional."""
    names = {module: name for name, module in model.named_modules()}
    found = []

    def hook(module, args, output):
        if not found and bool(torch.isinf(output).any() | torch.isnan(output).any()):
            found.append(names[module])

    handles = [module.register_forward_hook(hook) for module in names]
    try:
        with torch.inference_mode(), torch.autocast(inputs.device.type, dtype):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


class _Found(Exception):
    pass


def finder_stops_at_first(model, inputs, dtype):
    """Raise from the hook at the first non-finite output: the forward stops there (hooks still removed)."""

    def on_output(name):
        def hook(module, args, output):
            if not torch.isfinite(output).all():
                raise _Found(name)

        return hook

    handles = _watch(model, on_output)
    try:
        with torch.no_grad(), torch.autocast(device_type=inputs.device.type, dtype=dtype):
            model(inputs)
    except _Found as found:
        return found.args[0]
    finally:
        for handle in handles:
            handle.remove()
    return None


def finder_eval_and_restore(model, inputs, dtype):
    """Uses eval mode, and puts the mode back: the device type read from the parameters."""
    was_training = model.training
    model.eval()
    seen = []
    handles = _watch(model, lambda name: lambda m, a, out: seen.append((name, bool(out.isfinite().all()))))
    try:
        with torch.no_grad(), torch.autocast(device_type=next(model.parameters()).device.type, dtype=dtype):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return next((name for name, finite in seen if not finite), None)


def finder_global_hook(model, inputs, dtype):
    """A global module hook (every module of every model), removed in `finally`; "cuda" if inputs.is_cuda."""
    names = {id(m): n for n, m in model.named_modules()}
    found = []

    def hook(module, args, output):
        if id(module) in names and not found and not torch.isfinite(output).all():
            found.append(names[id(module)])

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        with torch.no_grad(), torch.autocast("cuda" if inputs.is_cuda else "cpu", dtype=dtype):
            model(inputs)
    finally:
        handle.remove()
    return found[0] if found else None


def finder_exit_stack(model, inputs, dtype):
    """ExitStack removes the handles; gradients left on; the check after the forward."""
    seen = []
    with contextlib.ExitStack() as stack:
        for name, module in model.named_modules():
            handle = module.register_forward_hook(lambda m, a, out, name=name: seen.append((name, out)))
            stack.callback(handle.remove)
        with torch.amp.autocast(inputs.device.type, dtype=dtype):
            model(inputs)
    return next((name for name, out in seen if not torch.isfinite(out).all()), None)


RIGHT_FINDERS = [
    finder_one_shared_hook,
    finder_stops_at_first,
    finder_eval_and_restore,
    finder_global_hook,
    finder_exit_stack,
]


@pytest.mark.parametrize("finder", RIGHT_FINDERS, ids=[f.__name__ for f in RIGHT_FINDERS])
def test_right_finders_written_differently_pass(finder):
    result = check_first_nonfinite_module(finder)
    assert result.passed, result.message
    assert "also when the forward raises" in result.message and "pretend GPU" in result.message
    assert global_hook_count() == 0


# ----------------------------------------------------------------------------------------------- 05.1 wrong


def _finder(
    model,
    inputs,
    dtype,
    *,
    device_type=None,
    eval_mode=False,
    train_after=False,
    finally_=True,
    autocast_dtype=None,
):
    """The reference finder with one planted mistake (the keywords say which)."""
    found = []

    def on_output(name):
        def hook(module, args, output):
            if not found and not torch.isfinite(output).all():
                found.append(name)

        return hook

    if eval_mode:
        model.eval()
    handles = _watch(model, on_output)
    device_type = device_type or inputs.device.type
    context = torch.autocast(device_type=device_type, dtype=autocast_dtype or dtype)
    if finally_:
        try:
            with torch.no_grad(), context:
                model(inputs)
        finally:
            for handle in handles:
                handle.remove()
    else:
        with torch.no_grad(), context:
            model(inputs)
        for handle in handles:
            handle.remove()
    if train_after:
        model.train()
    return found[0] if found else None


_global_handles = []


def finder_global_hook_left(model, inputs, dtype):
    _global_handles.append(torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: None))
    return _finder(model, inputs, dtype)


WRONG_FINDERS = {
    "no try/finally": (lambda m, i, d: _finder(m, i, d, finally_=False), "jumped over your handle.remove()"),
    "eval mode left on": (
        lambda m, i, d: _finder(m, i, d, eval_mode=True),
        "switched the model to eval mode",
    ),
    "model.train() at the end": (
        lambda m, i, d: _finder(m, i, d, eval_mode=True, train_after=True),
        "came in eval mode",
    ),
    "autocast('cpu') hard-coded": (
        lambda m, i, d: _finder(m, i, d, device_type="cpu"),
        "enters autocast for 'cpu' whatever the tensors' device",
    ),
    "autocast('cuda') hard-coded": (
        lambda m, i, d: _finder(m, i, d, device_type="cuda"),
        "entered autocast for 'cuda', but the tensors are on 'cpu'",
    ),
    "bfloat16 instead of the dtype argument": (
        lambda m, i, d: _finder(m, i, d, autocast_dtype=torch.bfloat16),
        "ran autocast in bfloat16, not in the dtype it was given",
    ),
    "class name": (lambda m, i, d: finder_class_name(m, i, d), "class name"),
    "a global hook left": (finder_global_hook_left, "global module hook(s)"),
}


def finder_class_name(model, inputs, dtype):
    name = _finder(model, inputs, dtype)
    return None if name is None else type(model.get_submodule(name)).__name__


@pytest.mark.parametrize("name", WRONG_FINDERS)
def test_natural_wrong_finders_are_named(name):
    finder, expected = WRONG_FINDERS[name]
    try:
        result = check_first_nonfinite_module(finder)
    finally:
        while _global_handles:
            _global_handles.pop().remove()
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_device_from_cuda_availability_is_rejected_on_either_machine():
    def finder(model, inputs, dtype):
        return _finder(model, inputs, dtype, device_type="cuda" if torch.cuda.is_available() else "cpu")

    result = check_first_nonfinite_module(finder)
    assert not result.passed
    assert "whatever the tensors' device" in result.message or "but the tensors are on" in result.message


def test_an_error_of_its_own_on_the_raising_model_is_still_reported():
    def finder(model, inputs, dtype):
        if isinstance(model, cases.RaisingModel):
            raise KeyError("my bug")
        return _finder(model, inputs, dtype)

    result = check_first_nonfinite_module(finder)
    assert not result.passed and "KeyError" in result.message


def test_the_pass_message_does_not_claim_an_untested_device():
    def finder(model, inputs, dtype):
        if inputs.device.type != "cpu":
            raise RuntimeError("no GPU code path")
        return _finder(model, inputs, dtype)

    result = check_first_nonfinite_module(finder)
    assert result.passed and "was not checked" in result.message


# ----------------------------------------------------------------------------------------------- 05.2 right


def _texture(model, x, gram_fn, device_type=None):
    h = model.features(x)
    with torch.autocast(device_type=device_type or x.device.type, enabled=False):
        gram = gram_fn(h)
    return model.head((gram / h.shape[1]).flatten(1))


RIGHT_TEXTURES = {
    "device from the parameters, torch.amp.autocast": lambda model, x: _texture(
        model, x, lambda h: h.float().mT @ h.float(), next(model.parameters()).device.type
    ),
    "is_cuda, einsum": lambda model, x: _texture(
        model, x, lambda h: torch.einsum("btc,btd->bcd", h.float(), h.float()), "cuda" if x.is_cuda else "cpu"
    ),
    "to(float32), bmm": lambda model, x: _texture(
        model, x, lambda h: torch.bmm(h.to(torch.float32).transpose(1, 2), h.to(torch.float32))
    ),
    "divided inside the block, cast back to half": lambda model, x: texture_cast_back(model, x),
}


def texture_cast_back(model, x):
    h = model.features(x)
    with torch.amp.autocast(x.device.type, enabled=False):
        h32 = h.float()
        gram = (h32.transpose(1, 2) @ h32 / h.shape[1]).to(h.dtype)
    return model.head(gram.flatten(1))


@pytest.mark.parametrize("name", RIGHT_TEXTURES)
def test_right_texture_forwards_written_differently_pass(name):
    result = check_texture_forward(RIGHT_TEXTURES[name])
    assert result.passed, result.message
    assert "pretend GPU" in result.message and "was not checked" not in result.message


# ----------------------------------------------------------------------------------------------- 05.2 wrong


def texture_features_too(model, x):
    with torch.autocast(device_type=x.device.type, enabled=False):
        h = model.features(x.float())
        gram = h.transpose(1, 2) @ h
    return model.head((gram / h.shape[1]).flatten(1))


WRONG_TEXTURES = {
    "torch.autocast('cpu', enabled=False)": (
        lambda model, x: _texture(model, x, lambda h: h.float().transpose(1, 2) @ h.float(), "cpu"),
        "switches autocast off for 'cpu' whatever the tensors' device",
    ),
    "torch.cpu.amp.autocast(enabled=False)": (
        lambda model, x: texture_old_api(model, x, torch.cpu.amp),
        "switches autocast off for 'cpu' whatever the tensors' device",
    ),
    "torch.cuda.amp.autocast(enabled=False)": (
        lambda model, x: texture_old_api(model, x, torch.cuda.amp),
        "switched autocast off for 'cuda', but these tensors are on",
    ),
    ".double()": (
        lambda model, x: _texture(model, x, lambda h: h.double().transpose(1, 2) @ h.double()),
        "float64",
    ),
    "features inside the float32 block": (texture_features_too, "starts too early"),
}


def texture_old_api(model, x, namespace):
    h = model.features(x)
    with namespace.autocast(enabled=False):
        gram = h.float().transpose(1, 2) @ h.float()
    return model.head((gram / h.shape[1]).flatten(1))


@pytest.mark.parametrize("name", WRONG_TEXTURES)
def test_natural_wrong_texture_forwards_are_named(name):
    forward, expected = WRONG_TEXTURES[name]
    result = check_texture_forward(forward)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_texture_device_from_cuda_availability_is_rejected_on_either_machine():
    def forward(model, x):
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
        return _texture(model, x, lambda h: h.float().transpose(1, 2) @ h.float(), device_type)

    result = check_texture_forward(forward)
    assert not result.passed and ("'cpu'" in result.message or "'cuda'" in result.message)


# ----------------------------------------------------------------------------------------------- the kernel


def test_checks_leave_no_pretence_no_hooks_and_no_autocast_behind():
    device_attribute = torch.Tensor.__dict__.get("device")
    init = torch.amp.autocast_mode.autocast.__init__
    check_first_nonfinite_module(WRONG_FINDERS["no try/finally"][0])
    check_texture_forward(WRONG_TEXTURES["torch.autocast('cpu', enabled=False)"][0])
    check_texture_forward(RIGHT_TEXTURES["is_cuda, einsum"])
    assert torch.Tensor.__dict__.get("device") is device_attribute and torch.randn(1).device.type == "cpu"
    assert torch.amp.autocast_mode.autocast.__init__ is init
    assert not autocast_enabled("cpu") and global_hook_count() == 0


def test_pretend_gpu_restores_everything_even_when_the_code_raises():
    x = torch.randn(2)
    with pytest.raises(ZeroDivisionError), cases.pretend_gpu() as entered:
        assert x.device.type == "cuda" and x.is_cuda and not x.is_cpu
        with torch.autocast(x.device.type, enabled=False):
            assert not autocast_enabled("cpu")
        raise ZeroDivisionError
    assert [(a.device_type, a.enabled) for a in entered] == [("cuda", False)]
    assert x.device.type == "cpu" and not x.is_cuda and x.is_cpu
    model = cases.RaisingModel()
    with pytest.raises(cases.PlantedError):
        model(torch.randn(1, 4))
    assert hook_count(model) == 0 and cases.tolerating_planted_error(model)(torch.randn(1, 4)) is None


def test_modes_are_compared_module_by_module():
    model = cases.finder_cases()[1][1]  # the nested block, in eval mode
    before = cases.training_flags(model)
    assert not any(before)
    model.block.train()
    assert cases.mode_change(before, cases.training_flags(model)) == "train"
    assert cases.mode_change(cases.training_flags(model), before) == "eval"
    assert cases.mode_change(before, before) == ""


@pytest.mark.parametrize(
    "check, name",
    [(check_first_nonfinite_module, "first_nonfinite_module"), (check_texture_forward, "texture_forward")],
)
def test_checks_answer_in_under_two_seconds(check, name):
    """Warm: the first optimizer a process creates imports torch._dynamo once (about 2 s here), which a
    learner has long paid for by the time they run a check."""
    fn = solution(LESSON, name)
    check(fn)
    began = time.perf_counter()
    assert check(fn).passed
    assert time.perf_counter() - began < 2.0


# ---------------------------------------------------------- more of a class's answers, checked by hand first


def finder_exit_stack_inference_mode(model, inputs, dtype):
    """ExitStack for the handles and the contexts; inference_mode; eval for the search, the mode put back."""
    was_training = model.training
    hits = []
    with contextlib.ExitStack() as stack:
        for name, module in model.named_modules():
            hook = module.register_forward_hook(
                lambda m, a, out, name=name: hits.append(name) if not torch.isfinite(out).all() else None
            )
            stack.callback(hook.remove)
        stack.callback(model.train, was_training)
        model.eval()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(torch.autocast(device_type=inputs.device.type, dtype=dtype))
        model(inputs)
    return hits[0] if hits else None


def finder_keeps_the_last_hit(model, inputs, dtype):
    """Every non-finite output overwrites the answer: the last module reached, not the first."""
    last = [None]

    def on_output(name):
        def hook(module, args, output):
            if not torch.isfinite(output).all():
                last[0] = name

        return hook

    handles = _watch(model, on_output)
    try:
        with torch.no_grad(), torch.autocast(inputs.device.type, dtype=dtype):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return last[0]


def test_class_finder_with_exit_stack_and_inference_mode_passes():
    result = check_first_nonfinite_module(finder_exit_stack_inference_mode)
    assert result.passed, result.message


def test_class_finder_that_keeps_the_last_hit_is_named():
    result = check_first_nonfinite_module(finder_keeps_the_last_hit)
    assert not result.passed and result.status == "failed"
    assert "you kept the last name your hooks saw (keep the first)" in result.message, result.message


def texture_rescaled_before_the_product(model, x):
    """Divides h by the time steps before the float32 product (so the Gram matrix is divided twice over)."""
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        h32 = h.float() / h.shape[1]
        gram = h32.transpose(1, 2) @ h32
    return model.head(gram.flatten(1))


def test_class_texture_rescaled_before_the_product_is_named():
    result = check_texture_forward(texture_rescaled_before_the_product)
    assert not result.passed and result.status == "failed"
    assert "does not reproduce TextureNet.forward: keep the math as it is" in result.message, result.message
