"""Lesson 05's checkers: the solutions pass, the stubs are "not done", each known mistake is named."""

import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.core.autocast_state import autocast_enabled
from amp_lessons.core.models import TextureNet, texture_batch
from amp_lessons.l05_nan_debugging import cases as cases
from amp_lessons.l05_nan_debugging import check as l05
from amp_lessons.l05_nan_debugging.check import check_first_nonfinite_module, check_texture_forward

LESSON = "05_nan_debugging.ipynb"


# ----------------------------------------------------------------------------------------------- checker 05.1


def test_finder_cases_overflow_only_in_fp16():
    for label, model, inputs, expected in cases.finder_cases():
        outputs = cases.outputs_in_finish_order(model, inputs, torch.float16)
        assert cases.first_name(outputs) == expected, label
        if torch.isfinite(inputs).all():
            unscaled = cases.outputs_in_finish_order(model, inputs, torch.float16, autocast=False)
            assert cases.first_name(unscaled) is None, label


def test_finder_solution_passes():
    result = check_first_nonfinite_module(solution(LESSON, "first_nonfinite_module"))
    assert result.passed, result.message


def test_finder_exercise_is_not_done():
    assert check_first_nonfinite_module(exercise(LESSON, "first_nonfinite_module")).status == NOT_DONE


def _hooked_run(model, inputs, dtype, *, names=None, autocast=True, remove=True):
    """Record (name, output) in finish order, the way learners write it (helper for the wrong answers)."""
    seen = []
    pairs = names if names is not None else list(model.named_modules())
    handles = [m.register_forward_hook(lambda mod, a, out, n=n: seen.append((n, out))) for n, m in pairs]
    try:
        with torch.no_grad(), torch.autocast(device_type="cpu", dtype=dtype, enabled=autocast):
            model(inputs)
    finally:
        if remove:
            for handle in handles:
                handle.remove()
    return seen


def _first_bad(seen, test=lambda t: not torch.isfinite(t).all()):
    return next((n for n, out in seen if test(out)), None)


def finder_without_autocast(model, inputs, dtype):
    return _first_bad(_hooked_run(model, inputs, dtype, autocast=False))


def finder_last_leaf(model, inputs, dtype):
    leaves = [(n, m) for n, m in model.named_modules() if next(m.children(), None) is None]
    bad = [n for n, out in _hooked_run(model, inputs, dtype, names=leaves) if not torch.isfinite(out).all()]
    return bad[-1] if bad else None


def finder_last_including_root(model, inputs, dtype):
    bad = [n for n, out in _hooked_run(model, inputs, dtype) if not torch.isfinite(out).all()]
    return bad[-1] if bad else None


def finder_nan_only(model, inputs, dtype):
    return _first_bad(_hooked_run(model, inputs, dtype), test=lambda t: torch.isnan(t).any())


def finder_inf_only(model, inputs, dtype):
    return _first_bad(_hooked_run(model, inputs, dtype), test=lambda t: torch.isinf(t).any())


def finder_top_level(model, inputs, dtype):
    return _first_bad(_hooked_run(model, inputs, dtype, names=list(model.named_children())))


def finder_definition_order(model, inputs, dtype):
    outputs = dict(_hooked_run(model, inputs, dtype))
    return next((n for n, _ in model.named_modules() if n and not torch.isfinite(outputs[n]).all()), None)


def finder_definition_order_with_root(model, inputs, dtype):
    outputs = dict(_hooked_run(model, inputs, dtype))
    return next((n for n, _ in model.named_modules() if not torch.isfinite(outputs[n]).all()), None)


def finder_keeps_hooks(model, inputs, dtype):
    return _first_bad(_hooked_run(model, inputs, dtype, remove=False))


def finder_halves_the_model(model, inputs, dtype):
    model.half()
    seen = _hooked_run(model, inputs.half(), dtype, autocast=False)
    return _first_bad(seen)


def finder_returns_module(model, inputs, dtype):
    name = _first_bad(_hooked_run(model, inputs, dtype))
    return None if name is None else model.get_submodule(name)


def finder_empty_string_when_finite(model, inputs, dtype):
    return _first_bad(_hooked_run(model, inputs, dtype)) or ""


@pytest.mark.parametrize(
    "wrong, expected",
    [
        (finder_without_autocast, "without autocast"),
        (finder_last_leaf, "LAST module"),
        (finder_nan_only, "NaN only"),
        (finder_top_level, "top-level children"),
        (finder_inf_only, "inf only"),
        (finder_definition_order, "order they are DEFINED"),
        (finder_definition_order_with_root, "lists the model itself first"),
        (finder_last_including_root, "fires LAST"),
        (finder_keeps_hooks, "left 6 hook(s)"),
        (finder_halves_the_model, "changed the model"),
        (finder_returns_module, "returned a module object"),
        (finder_empty_string_when_finite, "the answer is None"),
    ],
)
def test_finder_wrong_answers_are_named(wrong, expected):
    result = check_first_nonfinite_module(wrong)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def _raises(model, inputs, dtype):
    raise KeyError("oops")


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        ("first_nonfinite_module", "got a str"),
        (lambda model: None, "signature"),
        (_raises, "KeyError"),
        (lambda model, inputs, dtype: float("nan"), "returned a float"),
        (lambda model, inputs, dtype: 3, "returned a int"),
        (lambda model, inputs, dtype: "no such module", "you returned 'no such module'"),
    ],
)
def test_finder_checker_never_raises_on_junk(junk, expected):
    result = check_first_nonfinite_module(junk)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


# ----------------------------------------------------------------------------------------------- checker 05.2


def test_texture_solution_passes():
    result = check_texture_forward(solution(LESSON, "texture_forward"))
    assert result.passed, result.message


def test_texture_exercise_is_not_done():
    assert check_texture_forward(exercise(LESSON, "texture_forward")).status == NOT_DONE


def texture_unfixed(model, x):
    h = model.features(x)
    return model.head((h.transpose(1, 2) @ h / h.shape[1]).flatten(1))


def texture_everything_fp32(model, x):
    with torch.autocast(device_type=x.device.type, enabled=False):
        h = model.features(x.float())
        gram = h.transpose(1, 2) @ h / h.shape[1]
        return model.head(gram.flatten(1))


def texture_forgot_cast(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = h.transpose(1, 2) @ h
    return model.head((gram / h.shape[1]).flatten(1))


def texture_cast_one_side(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = h.float().transpose(1, 2) @ h
    return model.head((gram / h.shape[1]).flatten(1))


def texture_nan_to_num(model, x):
    h = model.features(x)
    gram = torch.nan_to_num(h.transpose(1, 2) @ h)
    return model.head((gram / h.shape[1]).flatten(1))


def texture_clamp(model, x):
    h = model.features(x)
    gram = (h.transpose(1, 2) @ h).clamp(max=65504)
    return model.head((gram / h.shape[1]).flatten(1))


def texture_wrong_op(model, x):
    h = model.features(x)
    gram = h.transpose(1, 2) @ h / h.shape[1]
    with torch.autocast(device_type=x.device.type, enabled=False):
        return model.head(gram.float().flatten(1))


def texture_cast_after(model, x):
    h = model.features(x)
    gram = (h.transpose(1, 2) @ h).float()
    return model.head((gram / h.shape[1]).flatten(1))


def texture_bfloat16(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        gram = h.transpose(1, 2) @ h
    return model.head((gram / h.shape[1]).flatten(1))


def texture_prescaled(model, x):
    h = model.features(x) / h_scale(x)
    return model.head((h.transpose(1, 2) @ h).flatten(1))


def h_scale(x):
    return x.shape[1] ** 0.5


def texture_too_wide(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = h.float().transpose(1, 2) @ h.float()
        return model.head((gram / h.shape[1]).flatten(1))


def texture_forgot_division(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = h.float().transpose(1, 2) @ h.float()
    return model.head(gram.flatten(1))


def texture_returns_gram(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        return h.float().transpose(1, 2) @ h.float()


def texture_switches_autocast_off(model, x):
    try:
        torch.set_autocast_enabled("cpu", False)
    except TypeError:  # torch < 2.4
        torch.set_autocast_cpu_enabled(False)
    return texture_too_wide(model, x)


@pytest.mark.parametrize(
    "wrong, expected",
    [
        (texture_unfixed, "Nothing was fixed"),
        (texture_everything_fp32, "whole forward ran in float32"),
        (texture_forgot_cast, "inputs are still float16"),
        (texture_cast_one_side, "Cast BOTH operands"),
        (texture_nan_to_num, "(nan_to_num)"),
        (texture_clamp, "(clamp)"),
        (texture_wrong_op, "wrong op"),
        (texture_cast_after, "AFTER the product"),
        (texture_bfloat16, "only 8 significant bits"),
        (texture_prescaled, "rescale"),
        (texture_too_wide, "wider than needed"),
        (texture_forgot_division, "does not reproduce TextureNet.forward"),
        (texture_returns_gram, "returned shape"),
        (texture_switches_autocast_off, "switched off for the caller"),
    ],
)
def test_texture_wrong_answers_are_named(wrong, expected):
    result = check_texture_forward(wrong)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def _texture_raises(model, x):
    return model.nonexistent(x)


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        (42, "got a int"),
        (lambda model: 1, "signature"),
        (_texture_raises, "AttributeError"),
        (lambda model, x: None, "returned a NoneType"),
        (lambda model, x: float("nan"), "returned a float"),
        (lambda model, x: torch.full((8, 3), float("nan")), "does not reproduce"),
        (lambda model, x: torch.zeros(8, 3, dtype=torch.int64), "does not reproduce"),
        (lambda model, x: torch.zeros(2), "returned shape"),
    ],
)
def test_texture_checker_never_raises_on_junk(junk, expected):
    result = check_texture_forward(junk)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_checkers_leave_autocast_off():
    check_texture_forward(texture_switches_autocast_off)
    check_first_nonfinite_module(finder_without_autocast)
    assert not autocast_enabled("cpu")


# -------------------------------------------------------------------------------- the rule tables, one by one


def finder_call(**facts):
    return l05.FinderCall(
        **{
            "label": "a case",
            "got": "0",
            "hooks_left": 0,
            "changed_model": False,
            "autocast_on": False,
            **facts,
        }
    )


CALL_RULE_CASES = {
    "hooks left when the forward raised": finder_call(hooks_left=2, raised=True),
    "left hooks on the model": finder_call(hooks_left=2),
    "left a global hook": finder_call(global_hooks_left=1),
    "changed the model": finder_call(changed_model=True),
    "left the model in eval mode": finder_call(mode_change="eval"),
    "left the model in training mode": finder_call(mode_change="train"),
    "left autocast on": finder_call(autocast_on=True),
    "returned a module": finder_call(got=torch.nn.Linear(2, 2)),
    "returned neither a name nor None": finder_call(got=3),
}


@pytest.mark.parametrize("name", CALL_RULE_CASES)
def test_each_call_rule_recognises_its_case(name):
    call = CALL_RULE_CASES[name]
    rule = first_mistake(l05.CALL_MISTAKES, call)
    assert rule is not None and rule.name == name and rule.text(call)
    assert first_mistake(l05.CALL_MISTAKES, finder_call()) is None
    assert first_mistake(l05.CALL_MISTAKES, finder_call(got=None)) is None
    assert set(CALL_RULE_CASES) == {rule.name for rule in l05.CALL_MISTAKES}


def wrong_answers(finder):
    """The cases ``finder`` gets wrong, as the checker collects them (without the per-call rules)."""
    wrong = []
    for label, model, inputs, expected in cases.finder_cases():
        with cases.watch_autocast() as entered:
            got = finder(model, inputs.clone(), l05.DTYPE)
        if got != expected:
            autocasts = tuple(autocast for autocast in entered if autocast.enabled)
            wrong.append(l05.WrongAnswer(label, got, expected, model, inputs, l05.DTYPE, autocasts))
    return wrong


def finder_named_the_model_on_one_case(model, inputs, dtype):
    right = _first_bad(_hooked_run(model, inputs, dtype))
    return {"2": "", "block.fc2": "block"}.get(right, right)


def finder_class_name(model, inputs, dtype):
    name = _first_bad(_hooked_run(model, inputs, dtype))
    return None if name is None else type(model.get_submodule(name)).__name__


def finder_cuda_autocast(model, inputs, dtype):
    """The CUDA habit: autocast for 'cuda' whatever the tensors' device (on CPU tensors it does nothing)."""
    seen = []
    handles = [
        m.register_forward_hook(lambda mod, a, out, n=n: seen.append((n, out)))
        for n, m in model.named_modules()
    ]
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return _first_bad(seen)


def finder_default_dtype(model, inputs, dtype):
    """autocast without dtype=: the CPU's default is bfloat16, which does not overflow here."""
    seen = []
    handles = [
        m.register_forward_hook(lambda mod, a, out, n=n: seen.append((n, out)))
        for n, m in model.named_modules()
    ]
    try:
        with torch.no_grad(), torch.autocast(device_type=inputs.device.type):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return _first_bad(seen)


FINDER_RULE_CASES = {
    "returned the model itself": finder_definition_order_with_root,
    "class name": finder_class_name,
    "autocast for another device": finder_cuda_autocast,
    "autocast in another dtype": finder_default_dtype,
    "ran without autocast": finder_without_autocast,
    "containers skipped": lambda model, inputs, dtype: _hooked_finder(lambda n, m: not list(m.children()))(
        model, inputs, dtype
    ),
    "kept the last": finder_last_leaf,
    "NaN only": finder_nan_only,
    "inf only": finder_inf_only,
    "top-level children only": finder_top_level,
    "definition order": finder_definition_order,
    "a name where everything is finite": finder_empty_string_when_finite,
    "returned the model itself once": finder_named_the_model_on_one_case,
    "another module": lambda model, inputs, dtype: "no such module",
}


@pytest.mark.parametrize("name", FINDER_RULE_CASES)
def test_each_finder_rule_recognises_its_case(name):
    wrong = wrong_answers(FINDER_RULE_CASES[name])
    rule = first_mistake(l05.FINDER_MISTAKES, wrong)
    assert rule is not None and rule.name == name
    assert rule.text(wrong) and isinstance(rule.details(wrong), list)
    assert wrong_answers(solution(LESSON, "first_nonfinite_module")) == []
    assert set(FINDER_RULE_CASES) == {rule.name for rule in l05.FINDER_MISTAKES}


def texture_right(model, x):
    return solution(LESSON, "texture_forward")(model, x)


def texture_gram_by_broadcasting(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = (h.float().unsqueeze(3) * h.float().unsqueeze(2)).sum(1)
    return model.head((gram / h.shape[1]).flatten(1))


def texture_bfloat16_under_autocast(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=autocast_enabled("cpu")):
        gram = h.transpose(1, 2) @ h
    return model.head((gram / h.shape[1]).flatten(1))


def texture_bfloat16_cast_back(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        gram = h.transpose(1, 2) @ h
    return model.head((gram.to(h.dtype) / h.shape[1]).flatten(1))


def texture_junk_under_autocast(model, x):
    return None if autocast_enabled("cpu") else texture_right(model, x)


def texture_shifted_under_autocast(model, x):
    return texture_right(model, x) + (1.0 if autocast_enabled("cpu") else 0.0)


def texture_run(texture_forward, *, autocast):
    model, x = TextureNet(seed=0), texture_batch(n=8, seed=0)[0]
    with torch.no_grad():
        reference = model(x)
    return l05._observe(texture_forward, model, x, reference, autocast=autocast)


PLAIN_RULE_CASES = {
    "not a tensor": lambda model, x: None,
    "not the logits' shape": texture_returns_gram,
    "Gram product in bfloat16": texture_bfloat16_cast_back,
    "hid the overflow": texture_clamp,
    "changed the math": texture_forgot_division,
}


@pytest.mark.parametrize("name", PLAIN_RULE_CASES)
def test_each_plain_texture_rule_recognises_its_case(name):
    run = texture_run(PLAIN_RULE_CASES[name], autocast=False)
    rule = first_mistake(l05.PLAIN_MISTAKES, run)
    assert rule is not None and rule.name == name and rule.text(run)
    assert first_mistake(l05.PLAIN_MISTAKES, texture_run(texture_right, autocast=False)) is None
    assert set(PLAIN_RULE_CASES) == {rule.name for rule in l05.PLAIN_MISTAKES}


def texture_features_fp32_too(model, x):
    with torch.autocast(device_type=x.device.type, enabled=False):
        h = model.features(x.float())
        gram = h.transpose(1, 2) @ h
    return model.head((gram / h.shape[1]).flatten(1))


def texture_float64(model, x):
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = h.double().transpose(1, 2) @ h.double()
    return model.head((gram / h.shape[1]).float().flatten(1))


def texture_cuda_autocast_off(model, x):
    h = model.features(x)
    with torch.autocast("cuda", enabled=False):  # the CUDA habit, on CPU tensors
        gram = h.float().transpose(1, 2) @ h.float()
    return model.head((gram / h.shape[1]).flatten(1))


AUTOCAST_RULE_CASES = {
    "not the logits": texture_junk_under_autocast,
    "features in float32 too": texture_features_fp32_too,
    "everything in float32": texture_everything_fp32,
    "no Gram product": texture_gram_by_broadcasting,
    "Gram product in bfloat16": texture_bfloat16_under_autocast,
    "Gram product in float64": texture_float64,
    "inputs left in float16": texture_forgot_cast,
    "the wrong op in float32": texture_wrong_op,
    "cast after the product": texture_cast_after,
    "autocast off for another device": texture_cuda_autocast_off,
    "nothing fixed": texture_unfixed,
    "hid the overflow": texture_nan_to_num,
    "rescaled instead": texture_prescaled,
    "float32 block too wide": texture_too_wide,
    "logits off the reference": texture_shifted_under_autocast,
}


@pytest.mark.parametrize("name", AUTOCAST_RULE_CASES)
def test_each_autocast_texture_rule_recognises_its_case(name):
    assert first_mistake(l05.PLAIN_MISTAKES, texture_run(AUTOCAST_RULE_CASES[name], autocast=False)) is None
    run = texture_run(AUTOCAST_RULE_CASES[name], autocast=True)
    rule = first_mistake(l05.AUTOCAST_MISTAKES, run)
    assert rule is not None and rule.name == name and rule.text(run)
    assert first_mistake(l05.AUTOCAST_MISTAKES, texture_run(texture_right, autocast=True)) is None
    assert set(AUTOCAST_RULE_CASES) == {rule.name for rule in l05.AUTOCAST_MISTAKES}


def texture_hard_coded_cpu(model, x):
    h = model.features(x)
    with torch.autocast("cpu", enabled=False):  # right on a CPU only
        gram = h.float().transpose(1, 2) @ h.float()
    return model.head((gram / h.shape[1]).flatten(1))


def texture_raises_on_gpu(model, x):
    if x.device.type == "cuda":
        raise RuntimeError("only on a GPU")
    return texture_right(model, x)


GPU_RULE_CASES = {
    "autocast off for a fixed device type": texture_hard_coded_cpu,
    "not fixed on a GPU": lambda model, x: texture_right(model, x) * (float("inf") if x.is_cuda else 1.0),
}


@pytest.mark.parametrize("name", GPU_RULE_CASES)
def test_each_gpu_texture_rule_recognises_its_case(name):
    model, x = TextureNet(seed=0), texture_batch(n=8, seed=0)[0]
    with torch.no_grad():
        reference = model(x)
    run = l05._observe_on_gpu(GPU_RULE_CASES[name], model, x, reference)
    rule = first_mistake(l05.GPU_MISTAKES, run)
    assert rule is not None and rule.name == name and rule.text(run)
    right = l05._observe_on_gpu(texture_right, model, x, reference)
    assert first_mistake(l05.GPU_MISTAKES, right) is None
    assert l05._observe_on_gpu(texture_raises_on_gpu, model, x, reference) is None  # nothing claimed
    assert set(GPU_RULE_CASES) == {rule.name for rule in l05.GPU_MISTAKES}


@pytest.mark.parametrize(
    "table", ["CALL_MISTAKES", "FINDER_MISTAKES", "PLAIN_MISTAKES", "AUTOCAST_MISTAKES", "GPU_MISTAKES"]
)
def test_each_rule_table_is_a_list_of_named_rules(table):
    """Each rule is a module-level name (a test can call it on its own), so the table reads as a list of names."""
    named = {id(value) for name, value in vars(l05).items() if not name.isupper()}
    assert all(id(rule) in named for rule in getattr(l05, table))


def test_finder_rules_carry_their_evidence():
    """05.1's rules list the wrong cases under the message: all of them, the first one, or none."""
    wrong = [
        l05.WrongAnswer("case A", "", "fc2", None, None),
        l05.WrongAnswer("case B", "", "fc1", None, None),
    ]
    assert len(l05.returned_the_model_itself.details(wrong)) == 2
    assert l05.ran_without_autocast.details(wrong) == [
        "case A: you returned '', the first non-finite module is 'fc2'"
    ]
    assert l05.a_name_where_everything_is_finite.details(wrong) == []
    assert l05.another_module.details(wrong)[1] == "case B: you returned '', expected 'fc1'"


# ----------------------------------- issue 19: a container's own overflow, the dtype argument, autocast left on


def _hooked_finder(select=lambda name, module: True, *, dtype_used=None):
    def finder(model, inputs, dtype):
        found = []

        def hook(name):
            def record(module, args, output):
                if not found and isinstance(output, torch.Tensor) and not torch.isfinite(output).all():
                    found.append(name)

            return record

        handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if select(n, m)]
        try:
            with torch.no_grad(), torch.autocast(inputs.device.type, dtype=dtype_used or dtype):
                model(inputs)
        finally:
            for handle in handles:
                handle.remove()
        return found[0] if found else None

    return finder


def test_a_container_computes_its_own_overflow_and_dtype_cases_hold():
    label, model, inputs, expected = cases.finder_cases()[-1]
    assert expected == "block" and isinstance(model.block, cases.GainBlock)
    for label, model, inputs, dtype, expected in cases.dtype_cases():
        assert cases.first_name(cases.outputs_in_finish_order(model, inputs, dtype)) == expected, label


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_hooked_finder(lambda n, m: not list(m.children())), "is a container, and its own forward code"),
        (
            _hooked_finder(lambda n, m: isinstance(m, torch.nn.Linear)),
            "is a container, and its own forward code",
        ),
        (_hooked_finder(dtype_used=torch.float16), "not in the dtype it was given (bfloat16)"),
    ],
    ids=["no children", "Linear only", "always float16"],
)
def test_finder_leaves_only_and_fixed_float16_are_named(wrong, words):
    result = check_first_nonfinite_module(wrong)
    assert result.status == "failed" and words in result.message, result.message


def finder_with_global_hook(model, inputs, dtype):
    names = {module: name for name, module in model.named_modules()}
    found = []

    def record(module, args, output):
        if module in names and not found and not torch.isfinite(output).all():
            found.append(names[module])

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        with torch.inference_mode(), torch.amp.autocast(inputs.device.type, dtype=dtype):
            model(inputs)
    finally:
        handle.remove()
    return next(iter(found), None)


def finder_with_pre_and_post_hooks(model, inputs, dtype):
    order, bad = [], {}
    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda m, a, n=name: order.append(n)))

        def post(m, a, out, n=name):
            if not bool(out.isfinite().all()):
                bad.setdefault(n, len(bad))  # a hook that returns a value would replace the output

        handles.append(module.register_forward_hook(post))
    try:
        with torch.autocast(device_type=inputs.device.type, dtype=dtype), torch.no_grad():
            model(inputs)
    finally:
        [h.remove() for h in handles]
    return min(bad, key=bad.get) if bad else None


@pytest.mark.parametrize(
    "variant", [finder_with_global_hook, finder_with_pre_and_post_hooks], ids=lambda f: f.__name__
)
def test_finder_new_styles_pass_on_the_new_cases(variant):
    result = check_first_nonfinite_module(variant)
    assert result.passed, result.message


def texture_autocast_switched_on(model, x):
    torch.set_autocast_enabled(x.device.type, True)  # "make sure autocast is on"
    h = model.features(x)
    with torch.autocast(device_type=x.device.type, enabled=False):
        gram = h.float().transpose(1, 2) @ h.float()
    return model.head((gram / h.shape[1]).flatten(1))


def texture_switch_by_hand(model, x):
    h = model.features(x)
    torch.set_autocast_enabled(x.device.type, False)
    gram = h.float().transpose(1, 2) @ h.float()
    torch.set_autocast_enabled(x.device.type, True)  # "back on" — also when the caller had it off
    return model.head((gram / h.shape[1]).flatten(1))


@pytest.mark.parametrize(
    "wrong", [texture_autocast_switched_on, texture_switch_by_hand], ids=lambda f: f.__name__
)
def test_texture_forward_leaving_autocast_on_is_named(wrong):
    result = check_texture_forward(wrong)
    assert result.status == "failed" and "left autocast switched on after it returned" in result.message
    assert "keep the math as it is" not in result.message
    assert not autocast_enabled("cpu")
