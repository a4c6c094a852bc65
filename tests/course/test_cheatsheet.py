"""docs/cheatsheet.md never rots: every python block runs, in order, in one namespace.

That is how a reader pastes them."""

import re
import warnings
from pathlib import Path

CHEATSHEET = Path(__file__).resolve().parents[2] / "docs" / "cheatsheet.md"


def blocks():
    text = CHEATSHEET.read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    for section in sections[1:]:
        title = section.splitlines()[0]
        for number, code in enumerate(re.findall(r"```python\n(.*?)```", section, flags=re.S)):
            yield f"{title} (block {number + 1})", code


def test_every_snippet_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "cheatsheet"}
    ran = []
    for where, code in blocks():
        exec(compile(code, f"cheatsheet: {where}", "exec"), namespace)
        ran.append(where)
    assert len(ran) >= 8
    assert namespace["passed"] in (True, False) and namespace["median"] > 0


def test_snippets_cover_what_the_course_teaches():
    titles = " ".join(where for where, _ in blocks()).lower()
    topics = ("training step", "accumulation", "inference", "reference", "non-finite", "checkpoint", "time")
    for topic in topics:
        assert topic in titles, topic


def test_no_deprecated_api():
    assert "torch.cuda.amp" not in CHEATSHEET.read_text(encoding="utf-8")


def run_all(tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "cheatsheet"}
    for where, code in blocks():
        exec(compile(code, f"cheatsheet: {where}", "exec"), namespace)
    return namespace


def test_accumulation_is_exact_for_unequal_micro_batches(tmp_path, monkeypatch):
    """Sum / samples of the whole batch gives the full batch's gradient; mean / N does not (16/16/16/2)."""
    import torch
    import torch.nn.functional as F

    ns = run_all(tmp_path, monkeypatch)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(50, 16) * 2, torch.randint(0, 4, (50,))
    model(x).sum().backward()  # any gradient left over must be cleared by accumulate_step
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay, .grad stays readable
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    sizes = (16, 16, 16, 2)
    pieces = list(zip(x.split(sizes), y.split(sizes)))
    with warnings.catch_warnings():  # autocast "in float32" is no autocast: torch warns and switches it off
        warnings.simplefilter("ignore")
        ns["accumulate_step"](model, optimizer, scaler, pieces, dtype=torch.float32, max_norm=None)
    accumulated = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    whole = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad()
    for xb, yb in pieces:
        (F.cross_entropy(model(xb), yb) / len(pieces)).backward()
    per_count = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert ((accumulated - whole).norm() / whole.norm()) < 1e-5
    assert ((per_count - whole).norm() / whole.norm()) > 0.1  # the rule the cheatsheet no longer gives


def test_finder_sees_nested_outputs_inputs_and_containers(tmp_path, monkeypatch):
    import torch
    from torch import nn

    ns = run_all(tmp_path, monkeypatch)
    find = ns["first_nonfinite_module"]

    class Attention(nn.Module):  # MultiheadAttention returns a tuple (output, weights)
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            out, _ = self.attn(x, x, x)
            return self.head(out)

    torch.manual_seed(0)
    model = Attention()
    assert find(model, torch.randn(2, 5, 8), dtype=torch.bfloat16) is None
    loud = torch.randn(2, 5, 8) * 1e5  # overflows FP16 inside the attention's projections
    assert find(model, loud, dtype=torch.float16) == "attn"

    class Between(nn.Module):  # the container computes the overflow itself, between two submodules
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x) * 1e39)

    class Own(nn.Module):  # ... or after its last submodule, in its own output
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            return {"logits": self.a(x) * 1e39}

    x = torch.randn(3, 4)
    assert find(Between(), x, dtype=torch.bfloat16) == "input of b"
    assert find(Own(), x, dtype=torch.bfloat16) == "(model)"
    bad = x.clone()
    bad[0, 0] = float("nan")
    assert find(Own(), bad, dtype=torch.bfloat16) == "input of (model)"  # the data


def test_true_fp32_pins_with_one_api_and_restores(tmp_path, monkeypatch):
    import torch

    from amp_lessons.core.environment import float32_matmul_settings, has_fp32_precision_api

    ns = run_all(tmp_path, monkeypatch)
    before = float32_matmul_settings()
    with ns["true_fp32"]():
        inside = float32_matmul_settings()
    assert float32_matmul_settings() == before
    if has_fp32_precision_api():
        assert inside["torch.backends.cuda.matmul.fp32_precision"] == "ieee"
        assert inside["torch.backends.cudnn.conv.fp32_precision"] == "ieee"
        assert inside["torch.backends.mkldnn.matmul.fp32_precision"] == "ieee"
    else:
        assert inside["torch.get_float32_matmul_precision()"] == "highest"
        assert inside["torch.backends.cudnn.allow_tf32"] is False
    assert ns["model"].training  # the comparison ran in eval() and handed the model back in train()
    saved = torch.load(_last_checkpoint(ns), weights_only=True)
    assert {"scheduler", "scaler", "data", "rng"} <= set(saved)


def _last_checkpoint(ns):
    import os

    return os.path.join(ns["folder"], "last.pt")
