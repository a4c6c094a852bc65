"""Lesson 10: what Hugging Face's and Lightning's precision flags really switch on, found by instrumenting a run.

Why: most people never write the AMP loop; they set ``TrainingArguments(bf16=True)`` or
``Trainer(precision="bf16-mixed")`` and assume the rest. Each flag is a bundle of the course's pieces — FP32 or
low-precision parameters (this lesson), autocast and its dtype (lesson 03), a GradScaler (lessons 02 and 03),
``unscale_`` before clipping (lesson 03) — and which pieces it turns on depends on the device, the library and its
version. So the flags are not read from documentation here: a tiny model is trained for a few steps under each, and
the run itself is watched — the parameters' dtype and the dtype a matmul produced inside ``forward``, every
``GradScaler`` created (and its scale at the end), and at each gradient clipping whether the scaler had already
unscaled the gradients. The frameworks' log lines and warnings are caught and summarised, not printed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_lessons.core.autocast_state import autocast_enabled
from amp_lessons.core.environment import dtype_name, one_cpu_thread
from amp_lessons.core.optional_libraries import library_support, torchao_support

__all__ = ["FLAGS", "FlagRun", "ProbeNet", "flag_table", "run_flag", "why_unusable"]

# (framework, flag, the course's lessons the flag's pieces come from)
FLAGS = (
    ("transformers", "bf16=True", "03 autocast (BF16); 10 FP32 parameters"),
    ("transformers", "fp16=True", "02/03 FP16 autocast + GradScaler (on CUDA); 10 FP32 parameters"),
    ("lightning", "bf16-mixed", "03 autocast (BF16); 10 FP32 parameters"),
    ("lightning", "16-mixed", "02/03 FP16 autocast + GradScaler, unscale_ before clipping"),
    ("lightning", "bf16-true", "10 pure BF16: BF16 parameters and states, no FP32 copy"),
)
SUBMODULES = {"transformers": "transformers.trainer", "lightning": "lightning.pytorch"}
LOGGERS = (
    "transformers",
    "accelerate",
    "lightning",
    "lightning.pytorch",
    "lightning.fabric",
    "pytorch_lightning",
)


@dataclass
class FlagRun:
    """What one flag did in a real run (``error`` when the framework refused it)."""

    framework: str
    flag: str
    parameter_dtype: str = "-"
    matmul_dtype: str = "-"
    autocast: bool | None = None
    scalers: int = 0
    scale: float | None = None
    unscaled_before_clip: str = "-"
    notes: list = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


class ProbeNet(nn.Module):
    """Two Linear layers that write down, inside ``forward``, the parameters' dtype and the matmul's output dtype."""

    def __init__(self, features: int = 8, classes: int = 4):
        super().__init__()
        self.first = nn.Linear(features, 16)
        self.second = nn.Linear(16, classes)
        self.seen: list = []

    def forward(self, x, labels=None):
        hidden = self.first(x)
        self.seen.append((self.first.weight.dtype, hidden.dtype, autocast_enabled(x.device.type)))
        logits = self.second(torch.relu(hidden))
        if labels is None:
            return logits
        return {"loss": F.cross_entropy(logits.float(), labels), "logits": logits}


@contextlib.contextmanager
def instrumented(record: FlagRun):
    """Watch every GradScaler created and every ``clip_grad_norm_`` call; keep the frameworks quiet."""
    scalers = []
    original_init = torch.amp.GradScaler.__init__
    original_clip = torch.nn.utils.clip_grad_norm_

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        scalers.append(self)

    def clip(parameters, max_norm, *args, **kwargs):
        enabled = [s for s in scalers if s.is_enabled()]
        stages = [state.get("stage") for s in enabled for state in s._per_optimizer_states.values()]
        if not enabled:
            record.unscaled_before_clip = "no scaler: nothing to unscale"
        else:
            unscaled = any(getattr(stage, "name", "") == "UNSCALED" for stage in stages)
            record.unscaled_before_clip = "yes" if unscaled else "NO: clipped scaled gradients"
        return original_clip(parameters, max_norm, *args, **kwargs)

    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    for name in LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            mock.patch.object(torch.amp.GradScaler, "__init__", init),
            mock.patch.object(torch.nn.utils, "clip_grad_norm_", clip),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("always")
            yield scalers
        record.notes.extend(_notes(caught))
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def _notes(caught) -> list:
    """The first line of each warning that says something about precision (deduplicated)."""
    notes = []
    for warning in caught:
        line = str(warning.message).strip().splitlines()[0] if str(warning.message).strip() else ""
        if (
            any(word in line.lower() for word in ("precision", "amp", "fp16", "bf16", "float16"))
            and line not in notes
        ):
            notes.append(line[:200])
    return notes


def _data(n: int = 32, features: int = 8, classes: int = 4):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, features, generator=generator), torch.randint(0, classes, (n,), generator=generator)


def _run_transformers(flag: str, model: ProbeNet, device: torch.device, folder: str) -> None:
    from transformers import Trainer, TrainingArguments

    x, y = _data()

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return {"x": x[i], "labels": y[i]}

    name, _ = flag.split("=")
    arguments = TrainingArguments(
        output_dir=folder,
        max_steps=3,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        max_grad_norm=1.0,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="no",
        use_cpu=device.type == "cpu",
        **{name: True},
    )
    Trainer(model=model, args=arguments, train_dataset=Rows()).train()


def _run_lightning(flag: str, model: ProbeNet, device: torch.device, folder: str) -> None:
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, index):
            return self.net(*batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    trainer = pl.Trainer(
        precision=flag,
        max_steps=3,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        gradient_clip_val=1.0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=folder,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_data()), batch_size=8))


def why_unusable(framework: str) -> str:
    """Why ``framework``'s trainer cannot be imported here ("" when it can), with the root cause of the failure."""
    support = library_support(*SUBMODULES[framework].split("."))
    if support.available:
        return ""
    installed = importlib.util.find_spec(framework) is not None
    if installed and framework == "transformers" and importlib.util.find_spec("torchao") is not None:
        if not torchao_support().available:  # transformers imports torchao when it is installed
            return (
                f"transformers is installed, but `{SUBMODULES[framework]}` does not import on torch "
                f"{torch.__version__}: it imports the installed torchao, which does not import on this torch "
                "(upgrade torch, or pip uninstall torchao)"
            )
    return support.reason


def run_flag(framework: str, flag: str, device="cpu") -> FlagRun:
    """Train ``ProbeNet`` for three steps under one framework flag and report what the run showed."""
    device = torch.device(device)
    record = FlagRun(framework, flag)
    reason = why_unusable(framework)
    if reason:
        record.error = reason
        return record
    model = ProbeNet()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, instrumented(record) as scalers, one_cpu_thread():
        try:
            (_run_transformers if framework == "transformers" else _run_lightning)(
                flag, model, device, folder
            )
        except Exception as exc:  # a framework that refuses a flag on this device says so with an exception
            record.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    record.seconds = time.perf_counter() - start
    if model.seen:
        parameters, matmul, autocast = model.seen[0]
        record.parameter_dtype, record.matmul_dtype, record.autocast = (
            dtype_name(parameters),
            dtype_name(matmul),
            autocast,
        )
    enabled = [s for s in scalers if s.is_enabled()]
    record.scalers = len(enabled)
    record.scale = float(enabled[0].get_scale()) if enabled else None
    return record


def flag_table(device="cpu", flags=FLAGS):
    """One row per flag: what the instrumented run showed, and the lessons its pieces come from."""
    import pandas as pd

    rows = []
    for framework, flag, lessons in flags:
        run = run_flag(framework, flag, device)
        rows.append(
            {
                "framework": framework,
                "flag": flag,
                "parameters": run.parameter_dtype,
                "matmul output": run.matmul_dtype,
                "autocast on": "-" if run.autocast is None else run.autocast,
                "GradScaler": "none" if not run.scalers else f"yes, scale {run.scale:g}",
                "unscaled before clipping": run.unscaled_before_clip,
                "what the framework said": run.error or "; ".join(run.notes) or "-",
                "course lessons": lessons,
            }
        )
    return pd.DataFrame(rows)
