"""Lesson 07's second checker (07.2 saved_activation_bytes): the solution passes, the stub is "not done", right
answers written differently pass, each known wrong answer is named by its own rule, junk never raises."""

import contextlib
import math
import time

import numpy as np
import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks import check_saved_activation_bytes as check
from amp_lessons.l07_measuring_gains import check as l07
from amp_lessons.l07_measuring_gains import memory

LESSON = "07_measuring_gains.ipynb"
NAME = "saved_activation_bytes"


def _autocast(inputs, dtype):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=inputs.device.type, dtype=dtype)


def _key(t):
    return (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))


def _saved(model, loss_fn, inputs, targets, dtype, *, grad=True):
    """Every tensor the pack hook receives (the helper the wrong answers below are built on)."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with _autocast(inputs, dtype):
            loss = loss_fn(model(inputs), targets)
    return saved, loss


def _distinct_bytes(saved):
    return sum({_key(t): t.numel() * t.element_size() for t in saved}.values())


def _message(fn):
    result = check(fn)
    assert not result.passed, "a wrong answer passed"
    return result.message


# ------------------------------------------------------------------------------- the solution and the exercise


def test_solution_passes():
    result = check(solution(LESSON, NAME))
    assert result.passed, result.message
    assert result.exercise == "07.2 saved_activation_bytes"


def test_solution_passes_in_strict_mode(strict):
    assert check(solution(LESSON, NAME)).passed


def test_untouched_exercise_is_not_done():
    result = check(exercise(LESSON, NAME))
    assert result.status == "not done", result.message


def test_check_is_fast():
    fn = solution(LESSON, NAME)
    check(fn)  # the first autocast call of a process pays one-off costs
    began = time.perf_counter()
    check(fn)
    assert time.perf_counter() - began < 2.0


def test_the_first_check_of_a_process_is_fast_too():
    began = time.perf_counter()
    check(solution(LESSON, NAME))
    assert time.perf_counter() - began < 2.0


# ------------------------------------------------------------------------ the reference agrees with the lesson


@pytest.mark.parametrize("probe", l07.MEMORY_PROBES, ids=lambda p: p.name)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16], ids=str)
def test_reference_is_the_total_of_saved_tensor_reports_bytes(probe, dtype):
    if dtype is not None and dtype not in l07.cpu_autocast_dtypes():
        pytest.skip(f"CPU autocast does not run {dtype} on this torch")
    expected = l07.saved_figures(*l07._build(probe), dtype=dtype).expected
    report = memory.saved_tensor_report(*l07._build(probe), dtype=dtype)
    assert expected == int(report["bytes"].sum())


def test_reference_agrees_with_saved_tensor_report_on_the_lessons_model():
    from amp_lessons.core.models import TimingMLP

    torch.manual_seed(0)
    model, x, y = TimingMLP(256, 512, 10), torch.randn(192, 256), torch.randint(0, 10, (192,))
    for dtype in (None, *l07.cpu_autocast_dtypes()):
        figures = l07.saved_figures(model, torch.nn.functional.cross_entropy, x, y, dtype=dtype)
        report = memory.saved_tensor_report(model, torch.nn.functional.cross_entropy, x, y, dtype=dtype)
        assert figures.expected == int(report["bytes"].sum())


@pytest.mark.parametrize("probe", l07.MEMORY_PROBES, ids=lambda p: p.name)
def test_every_meaning_of_distinct_gives_the_same_number_on_the_probes(probe):
    """So an answer keyed by data_ptr or by storage passes: none of the probes saves a reshaped view."""
    for dtype in (None, *l07.cpu_autocast_dtypes()):
        saved, _ = _saved(*l07._build(probe), dtype)
        by_key = _distinct_bytes(saved)
        by_pointer = sum({t.data_ptr(): t.numel() * t.element_size() for t in saved}.values())
        by_storage = sum(
            {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}.values()
        )
        assert by_key == by_pointer == by_storage


def test_every_mistakes_figure_is_its_own():
    """On each case the wrong figures differ from each other, and each differs from the answer somewhere."""
    caught = set()
    for probe, dtype, figures, fp32, default in l07.saved_bytes_cases():
        named = {
            "numel": {figures.numel, figures.numel_every_save},
            "every save": {figures.every_save},
            "without parameters": {figures.without_parameters},
            "parameters": {figures.parameters, figures.parameters_in_dtype},
            "outputs": set(figures.outputs),
            "no autocast": {fp32} if dtype is not None else set(),
            "autocast for None": {default} if dtype is None else set(),
            "zero": {0},
        }
        wrong = {name: values - {figures.expected} for name, values in named.items()}
        everything = [value for values in wrong.values() for value in values]
        assert len(everything) == len(set(everything)), (probe.name, dtype, named)
        caught |= {name for name, values in wrong.items() if values}
    assert caught == set(named)


# ----------------------------------------------------------------------------- right, written differently


class SavedTensorMeter:
    """A context manager that installs the hooks itself and keeps the tensors by data_ptr."""

    def __init__(self):
        self.tensors = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t):
        self.tensors.setdefault(t.data_ptr(), t)
        return t

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False

    @property
    def bytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def with_a_context_manager_class(model, loss_fn, inputs, targets, *, dtype):
    meter = SavedTensorMeter()
    with meter:
        if dtype is None:
            loss_fn(model(inputs), targets)
        else:
            with torch.autocast(inputs.device.type, dtype=dtype):
                loss_fn(model(inputs), targets)
    return meter.bytes


def with_a_set_of_storages(model, loss_fn, inputs, targets, *, dtype):
    """Distinct storages (their own byte counts), autocast switched by `enabled=`, numpy's sum."""
    storages = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    def unpack(t):
        return t

    precision = dtype if dtype is not None else torch.bfloat16
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with torch.autocast(device_type=inputs.device.type, dtype=precision, enabled=dtype is not None):
            loss = loss_fn(model(inputs), targets)
    del loss
    return np.sum(list(storages.values()), dtype=np.int64)  # a NumPy integer: accepted


def with_a_list_and_an_exit_stack(model, loss_fn, inputs, targets, *, dtype):
    """Tensors kept in a list, duplicates found afterwards; contexts entered through an ExitStack."""
    kept = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t)
        )
        if dtype is not None:
            stack.enter_context(torch.autocast(device_type=inputs.device.type, dtype=dtype))
        output = model(inputs)
        loss = loss_fn(output, targets)
    unique = {}
    for t in kept:
        unique[(t.data_ptr(), t.dtype, t.shape, t.stride())] = t
    total = 0
    for t in unique.values():
        total += t.numel() * t.element_size()
    del loss, output
    return total


def with_a_decorated_generator(model, loss_fn, inputs, targets, *, dtype):
    """A @contextmanager helper that yields the record; element sizes from torch.finfo/iinfo."""

    @contextlib.contextmanager
    def recording():
        record = {}

        def pack(t):
            bits = (torch.finfo(t.dtype) if t.is_floating_point() else torch.iinfo(t.dtype)).bits
            record[(t.data_ptr(), t.dtype, t.size(), t.stride())] = t.numel() * bits // 8
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield record

    with recording() as record, _autocast(inputs, dtype):
        loss_fn(model(inputs), targets)
    return int(sum(record.values()))


@pytest.mark.parametrize(
    "answer",
    [
        with_a_context_manager_class,
        with_a_set_of_storages,
        with_a_list_and_an_exit_stack,
        with_a_decorated_generator,
    ],
)
def test_right_answers_written_differently_pass(answer):
    result = check(answer)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------- each known mistake


def no_autocast(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, None)
    return _distinct_bytes(saved)


def autocast_for_another_device(model, loss_fn, inputs, targets, *, dtype):
    saved = {}

    def pack(t):
        saved[_key(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device_type="cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss_fn(model(inputs), targets)
    return sum(saved.values())


def autocast_even_for_none(model, loss_fn, inputs, targets, *, dtype):
    saved = {}

    def pack(t):
        saved[_key(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):  # dtype=None: autocast's default
            loss_fn(model(inputs), targets)
    return sum(saved.values())


def counts_elements(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return sum({_key(t): t.numel() for t in saved}.values())


def counts_the_parameters(model, loss_fn, inputs, targets, *, dtype):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def under_no_grad(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype, grad=False)
    return _distinct_bytes(saved)


def counts_the_output(model, loss_fn, inputs, targets, *, dtype):
    with _autocast(inputs, dtype):
        output = model(inputs)
    return output.numel() * output.element_size()


def counts_the_loss(model, loss_fn, inputs, targets, *, dtype):
    with _autocast(inputs, dtype):
        loss = loss_fn(model(inputs), targets)
    return loss.numel() * loss.element_size()


def counts_every_save(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return sum(t.numel() * t.element_size() for t in saved)


def leaves_out_the_parameters(model, loss_fn, inputs, targets, *, dtype):
    """What the lesson's memory_breakdown lists as saved activations + weight copies (no parameter itself)."""
    weights = {p.data_ptr() for p in model.parameters()}
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return _distinct_bytes([t for t in saved if t.data_ptr() not in weights])


def leaves_hooks_installed(model, loss_fn, inputs, targets, *, dtype):
    saved = {}

    def pack(t):
        saved[_key(t)] = t.numel() * t.element_size()
        return t

    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t).__enter__()  # never left
    with _autocast(inputs, dtype):
        loss_fn(model(inputs), targets)
    return sum(saved.values())


def calls_backward(model, loss_fn, inputs, targets, *, dtype):
    saved, loss = _saved(model, loss_fn, inputs, targets, dtype)
    loss.backward()
    return _distinct_bytes(saved)


def switches_to_eval(model, loss_fn, inputs, targets, *, dtype):
    model.eval()  # "measurement mode"
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return _distinct_bytes(saved)


def switches_to_train(model, loss_fn, inputs, targets, *, dtype):
    model.train()
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return _distinct_bytes(saved)


def returns_a_tensor(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return torch.tensor([t.numel() * t.element_size() for t in {_key(t): t for t in saved}.values()]).sum()


def returns_kib(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return _distinct_bytes(saved) / 1024


def returns_a_float(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return float(_distinct_bytes(saved))


def forgets_to_return(model, loss_fn, inputs, targets, *, dtype):
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    _distinct_bytes(saved)


def counts_floating_point_only(model, loss_fn, inputs, targets, *, dtype):
    """Leaves out the integer targets the loss saves: a number no known mistake explains."""
    saved, _ = _saved(model, loss_fn, inputs, targets, dtype)
    return _distinct_bytes([t for t in saved if t.is_floating_point()])


@pytest.mark.filterwarnings("ignore:CUDA is not available")
@pytest.mark.parametrize(
    "answer, rule",
    [
        (no_autocast, l07.ignored_autocast),
        (autocast_for_another_device, l07.ignored_autocast),
        (autocast_even_for_none, l07.used_autocast_for_none),
        (counts_elements, l07.counted_elements),
        (counts_the_parameters, l07.counted_the_parameters),
        (under_no_grad, l07.measured_under_no_grad),
        (counts_the_output, l07.counted_the_outputs),
        (counts_the_loss, l07.counted_the_outputs),
        (counts_every_save, l07.counted_every_save),
        (leaves_out_the_parameters, l07.left_out_the_parameters),
        (leaves_hooks_installed, l07.left_hooks_installed),
        (calls_backward, l07.ran_backward),
        (switches_to_eval, l07.changed_train_or_eval_mode),
        (switches_to_train, l07.changed_train_or_eval_mode),
        (returns_a_tensor, l07.returned_a_tensor_of_bytes),
        (returns_kib, l07.returned_a_float),
        (returns_a_float, l07.returned_a_float),
        (forgets_to_return, l07.returned_not_an_int),
        (counts_floating_point_only, l07.returned_wrong_bytes),
    ],
    ids=lambda value: getattr(value, "__name__", getattr(value, "name", "")),
)
def test_each_wrong_answer_is_named_by_its_rule(answer, rule):
    message = _message(answer)
    assert PHRASES[rule] in message, message
    assert not [r.name for r, phrase in PHRASES.items() if r is not rule and phrase in message], message


# The words only that rule's message contains.
PHRASES = {
    l07.returned_a_tensor_of_bytes: "You returned a tensor",
    l07.returned_a_float: "You returned a float",
    l07.returned_not_an_int: "returned None: did you forget",
    l07.left_hooks_installed: "hooks are still installed",
    l07.ran_backward: "you ran backward",
    l07.changed_train_or_eval_mode: "You switched the model between train() and eval()",
    l07.autocast_in_another_dtype: "You asked autocast for",
    l07.measured_under_no_grad: "autograd saved nothing",
    l07.used_autocast_for_none: "what autocast's default bfloat16 saves",
    l07.ignored_autocast: "the FP32 figure",
    l07.counted_elements: "the number of ELEMENTS",
    l07.counted_the_parameters: "ALL the model's parameters",
    l07.counted_every_save: "every save counted",
    l07.left_out_the_parameters: "you left out the saved tensors that are parameters",
    l07.counted_the_outputs: "what the forward pass returns",
    l07.returned_wrong_bytes: "the tensors autograd saves in that forward pass and loss take",
}


def test_every_rule_has_a_wrong_answer_above():
    rules = [
        r
        for table in (l07.SAVED_RESULT_MISTAKES, l07.SAVED_USAGE_MISTAKES, l07.SAVED_VALUE_MISTAKES)
        for r in table
    ]
    assert set(rules) == set(PHRASES)


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_the_messages_say_what_each_number_is():
    assert "ELEMENTS" in _message(counts_elements)
    assert "ALL the model's parameters" in _message(counts_the_parameters)
    assert "every save counted" in _message(counts_every_save)
    assert "left out the saved tensors that are parameters" in _message(leaves_out_the_parameters)
    assert "what the forward pass returns" in _message(counts_the_output)
    assert "It is the answer in KiB" in _message(returns_kib)
    assert "did you forget `return" in _message(forgets_to_return)
    assert "the FP32 figure" in _message(autocast_for_another_device)
    assert "(model: " in _message(counts_floating_point_only)


def test_a_leaky_answer_leaves_no_hooks_behind():
    _message(leaves_hooks_installed)
    assert not l07._hooks_active()


def test_hooks_left_by_an_earlier_run_do_not_hide_the_leak():
    torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()  # an earlier cell's leak
    assert "still installed" in _message(leaves_hooks_installed)
    assert not l07._hooks_active()
    assert check(solution(LESSON, NAME)).passed


def switches_gradients_off(model, loss_fn, inputs, targets, *, dtype):
    torch.set_grad_enabled(False)  # and never back on
    return _distinct_bytes(_saved(model, loss_fn, inputs, targets, dtype, grad=False)[0])


def test_gradients_left_off_are_named_not_a_checker_error():
    result = check(switches_gradients_off)
    assert result.status == "failed" and "autograd saved nothing" in result.message, result.message
    assert torch.is_grad_enabled()


def test_the_callers_model_and_rng_are_left_alone():
    state = torch.get_rng_state()
    check(solution(LESSON, NAME))
    assert torch.equal(state, torch.get_rng_state())


# ----------------------------------------------------------------------------------------------- junk


def raises(model, loss_fn, inputs, targets, *, dtype):
    raise ValueError("boom")


def returns_nan(model, loss_fn, inputs, targets, *, dtype):
    return math.nan


def returns_text(model, loss_fn, inputs, targets, *, dtype):
    return "1604 bytes"


def returns_a_list(model, loss_fn, inputs, targets, *, dtype):
    return [1, 2, 3]


def returns_true(model, loss_fn, inputs, targets, *, dtype):
    return True


def wrong_signature(model, inputs):
    return 0


def returns_a_huge_tensor(model, loss_fn, inputs, targets, *, dtype):
    return torch.ones(3)


def returns_infinity(model, loss_fn, inputs, targets, *, dtype):
    return float("inf")


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "saved_activation_bytes",
        42,
        raises,
        returns_nan,
        returns_text,
        returns_a_list,
        returns_true,
        wrong_signature,
        returns_a_huge_tensor,
        returns_infinity,
        lambda *args, **kwargs: None,
    ],
)
def test_junk_never_raises(junk):
    result = check(junk)
    assert not result.passed
    assert result.status != "checker error", result.message
