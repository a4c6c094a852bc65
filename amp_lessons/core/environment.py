"""Seed everything, pick the device, and describe what this machine can do for mixed precision.

Why probe instead of guess: whether autocast in a dtype "works" depends on the torch build, the
device and sometimes the exact chip (an old GPU has no fast BF16; a CPU build may warn and quietly
disable autocast for FP16). So the card runs a tiny op in each dtype and reports the dtype that
actually came out.
"""

from __future__ import annotations

import contextlib
import html
import os
import platform
import random
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

MIN_TORCH = (2, 4)
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)


class SetupError(RuntimeError):
    """Raised when the environment cannot be used as asked (e.g. a GPU is required but missing)."""


def dtype_name(dtype: torch.dtype) -> str:
    """'float16' for torch.float16: how the course prints a dtype in tables and messages."""
    return str(dtype).replace("torch.", "")


def torch_version_tuple(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.14.1+cu130'."""
    text = (version or torch.__version__).split("+")[0]
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    while len(parts) < 2:
        parts.append(0)
    return parts[0], parts[1]


def pick_device() -> torch.device:
    """CUDA when visible, else CPU; ``AMP_LESSONS_DEVICE`` overrides; ``AMP_LESSONS_REQUIRE_CUDA=1`` insists.

    ROCm builds of torch also report their GPU as ``cuda``, so this covers AMD GPUs too.
    """
    forced = os.environ.get("AMP_LESSONS_DEVICE", "").strip()
    if forced:
        try:
            device = torch.device(forced)
        except RuntimeError:
            raise SetupError(
                f"AMP_LESSONS_DEVICE={forced!r} is not a device torch knows. Use 'cpu' or 'cuda', or unset "
                "it."
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise SetupError(
                f"AMP_LESSONS_DEVICE={forced!r} asks for a GPU, but torch sees none "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
                "Unset AMP_LESSONS_DEVICE to run on the CPU, or install a CUDA build of torch."
            )
        if device.type not in ("cpu", "cuda"):
            raise SetupError(f"AMP_LESSONS_DEVICE={forced!r}: this course supports 'cpu' and 'cuda' devices.")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    if os.environ.get("AMP_LESSONS_REQUIRE_CUDA", "") == "1" and device.type != "cuda":
        raise SetupError(
            "AMP_LESSONS_REQUIRE_CUDA=1 is set, but this run is on the CPU: "
            + (
                "AMP_LESSONS_DEVICE forces the CPU."
                if forced
                else f"torch sees no GPU (torch {torch.__version__}, CUDA build: "
                f"{torch.version.cuda or 'no'})."
            )
            + " On a GPU runner check the driver (nvidia-smi) and that a CUDA build of torch is installed."
        )
    return device


@contextlib.contextmanager
def cpu_threads(count: int | None):
    """Run the block with ``count`` torch CPU threads (restored afterwards); ``None`` changes nothing.

    The lesson models are tiny: a multi-threaded CPU op on a small matrix spends its time waiting at thread
    barriers, and on a busy machine (other notebooks, a browser) that wait can be 10-100x the arithmetic.
    One thread is faster for them, timing under it is stable, and float32 reductions happen in the same
    order on every laptop. GPU work is unaffected.
    """
    if count is None:
        yield
        return
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"cpu_threads needs a whole number of threads >= 1 (or None), got {count!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def one_cpu_thread():
    """``cpu_threads(1)``: the setting every small training loop in the course runs under."""
    return cpu_threads(1)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so every run of a lesson shows the same numbers."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def probe_autocast(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    """Run a tiny matmul under autocast and report whether it really produced ``dtype``."""
    a = torch.ones(8, 8, device=device)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device_type=device.type, dtype=dtype):
                out = a @ a
    except Exception as exc:  # an unsupported dtype raises on some builds
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    if out.dtype == dtype:
        return True, "matmul ran in " + dtype_name(dtype)
    note = "; ".join(str(w.message).splitlines()[0] for w in caught) or "autocast left the matmul in " + str(
        out.dtype
    )
    return False, note


def probe_grad_scaler(device: torch.device) -> tuple[bool, str]:
    """Run one scaled step with ``torch.amp.GradScaler`` on this device."""
    try:
        scaler = torch.amp.GradScaler(device.type)
        weight = torch.ones(2, device=device, requires_grad=True)
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler.scale((weight * 3).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, f"torch.amp.GradScaler('{device.type}') ran a step"


def cpu_has_native_bf16() -> bool | None:
    """Whether the CPU has BF16 instructions (AVX512-BF16 or AMX); None when torch cannot tell."""
    cpu = getattr(torch, "cpu", None)
    answers = []
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        probe = getattr(cpu, name, None)
        if probe is None:
            continue
        try:
            answers.append(bool(probe()))
        except Exception:
            continue
    return any(answers) if answers else None


# torch >= 2.9 controls float32 precision per backend and op with ``fp32_precision`` attributes; the legacy
# switches (``allow_tf32``, ``set_float32_matmul_precision``) still exist there, but reading a legacy switch
# after the new API set something raises ("you have used mix of the legacy and new APIs"). So the course reads
# and pins with whichever API the installed torch has, and never with the other one.
FP32_PRECISION_OPS = (  # (attribute path under torch.backends, how the card names it)
    ("cuda.matmul", "CUDA matmul"),
    ("cudnn.conv", "cuDNN conv"),
    ("cudnn.rnn", "cuDNN RNN"),
    ("mkldnn.matmul", "oneDNN (CPU) matmul"),
    ("mkldnn.conv", "oneDNN conv"),
    ("mkldnn.rnn", "oneDNN RNN"),
)
LEGACY_FP32_SWITCHES = (
    "torch.get_float32_matmul_precision()",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cudnn.allow_tf32",
)


def has_fp32_precision_api() -> bool:
    """Whether this torch has ``torch.backends.fp32_precision`` (torch 2.9 and later)."""
    return hasattr(torch.backends, "fp32_precision")


def fp32_precision_backend(path: str):
    """``torch.backends.cuda.matmul`` for ``'cuda.matmul'``; None where this torch lacks it."""
    obj = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def fp32_precision_name(path: str) -> str:
    """The full attribute name of one new-API switch: 'torch.backends.cuda.matmul.fp32_precision'."""
    return f"torch.backends.{path}.fp32_precision"


def _new_api_settings() -> dict:
    settings = {}
    for path, _ in FP32_PRECISION_OPS:
        backend = fp32_precision_backend(path)
        if backend is not None:
            # torch resolves 'none' through the backend and the global setting; 'none' left means IEEE FP32
            settings[fp32_precision_name(path)] = str(backend.fp32_precision)
    return settings


def _legacy_settings() -> dict:
    settings = {}
    readers = (
        torch.get_float32_matmul_precision,
        lambda: bool(torch.backends.cuda.matmul.allow_tf32),
        lambda: bool(torch.backends.cudnn.allow_tf32),
    )
    for name, read in zip(LEGACY_FP32_SWITCHES, readers):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                settings[name] = read()
            except Exception as exc:  # kept so a card never fails to display
                settings[name] = f"unreadable ({type(exc).__name__})"
    return settings


def float32_matmul_settings() -> dict:
    """The switches that decide whether an "FP32" matmul, convolution or RNN really computes in FP32.

    On NVIDIA GPUs since Ampere, TF32 keeps FP32's range but only 10 mantissa bits for the products inside a
    matmul: about 1e-3 relative error instead of 1e-7; on CPUs with BF16 instructions (AVX512-BF16, AMX)
    oneDNN can likewise run float32 matmuls in BF16. On torch 2.9 and later this reads the ``fp32_precision``
    of each backend and op (``'ieee'``, ``'tf32'``, ``'bf16'``; ``'none'`` = not set, which is IEEE FP32),
    and never a legacy switch; on older torch the legacy ones. Defaults: CUDA matmuls FP32, cuDNN convolutions
    and RNNs TF32, oneDNN FP32. A baseline that calls itself FP32 records and pins these (lessons 04 and 08).
    """
    return _new_api_settings() if has_fp32_precision_api() else _legacy_settings()


def reduced_matmul_switches(settings: dict, device_type: str) -> list[str]:
    """The switches in ``settings`` that let float32 matmuls on ``device_type`` compute below FP32.

    CUDA: TF32 (``cuda.matmul`` ``'tf32'``; legacy: precision 'high'/'medium' or ``allow_tf32``). CPU: oneDNN
    in BF16 or TF32 (``mkldnn.matmul``; legacy: precision 'medium'), which only CPUs with BF16 (or TF32)
    instructions act on. An empty list: the matmuls were true FP32.
    """
    legacy_precision = settings.get("torch.get_float32_matmul_precision()")
    found = []
    if device_type == "cuda":
        if settings.get("torch.backends.cuda.matmul.fp32_precision") == "tf32":
            found.append("torch.backends.cuda.matmul.fp32_precision")
        if legacy_precision not in (None, "highest"):
            found.append("torch.get_float32_matmul_precision()")
        if settings.get("torch.backends.cuda.matmul.allow_tf32") is True:
            found.append("torch.backends.cuda.matmul.allow_tf32")
    else:
        if settings.get("torch.backends.mkldnn.matmul.fp32_precision") in ("bf16", "tf32"):
            found.append("torch.backends.mkldnn.matmul.fp32_precision")
        if legacy_precision == "medium":
            found.append("torch.get_float32_matmul_precision()")
    return found


def float32_settings_text(settings: dict | None = None) -> str:
    """One line for the environment card: what each backend's float32 ops really compute in."""
    settings = float32_matmul_settings() if settings is None else settings
    if any(name in settings for name in LEGACY_FP32_SWITCHES):
        on_off = {True: "on", False: "off"}
        matmul = settings.get("torch.backends.cuda.matmul.allow_tf32")
        cudnn = settings.get("torch.backends.cudnn.allow_tf32")
        return (
            f"float32 matmul precision '{settings.get('torch.get_float32_matmul_precision()')}'; "
            f"TF32 CUDA matmuls {on_off.get(matmul, matmul)}, TF32 cuDNN convolutions "
            f"{on_off.get(cudnn, cudnn)} (legacy TF32 switches: torch < 2.9)"
        )
    parts = []
    for path, what in FP32_PRECISION_OPS:
        value = settings.get(fp32_precision_name(path))
        if value is not None:
            parts.append(f"{what} {'ieee' if value == 'none' else value}")
    return ", ".join(parts) + " (fp32_precision API; ieee = true FP32)"


@dataclass
class Environment:
    """What the course found on this machine. Displays as a card in Jupyter and as text elsewhere."""

    device: torch.device
    device_name: str
    torch_version: str
    python_version: str
    seed: int
    cuda_version: str | None
    hip_version: str | None
    autocast: dict = field(default_factory=dict)  # dtype name -> (works, note)
    grad_scaler: tuple = (False, "")
    cpu_native_bf16: bool | None = None
    threads: int = 1
    float32_settings: dict = field(default_factory=dict)  # what "FP32" matmuls really use (TF32 switches)

    @property
    def device_type(self) -> str:
        return self.device.type

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def autocast_dtypes(self) -> list[torch.dtype]:
        """The autocast dtypes that really work here, in the order float16, bfloat16."""
        return [d for d in AUTOCAST_DTYPES if self.autocast.get(dtype_name(d), (False,))[0]]

    def rows(self) -> list[tuple[str, str]]:
        yes_no = {True: "yes", False: "no", None: "unknown"}
        rows = [
            (
                "torch",
                self.torch_version
                + ("" if torch_version_tuple(self.torch_version) >= MIN_TORCH else "  (too old: need 2.4+)"),
            ),
            ("python", self.python_version),
            (
                "device",
                f"{self.device} — {self.device_name}"
                + ("" if self.is_gpu else f" ({self.threads} torch CPU threads)"),
            ),
        ]
        if self.hip_version:
            rows.append(
                ("GPU platform", f"ROCm/HIP {self.hip_version} (AMD GPUs are still called 'cuda' in torch)")
            )
        elif self.cuda_version:
            visible = "" if self.is_gpu else ", but no GPU visible"
            rows.append(("GPU platform", f"CUDA {self.cuda_version} build{visible}"))
        for name, (works, note) in self.autocast.items():
            rows.append((f"autocast {name}", ("works" if works else "does not work") + f" ({note})"))
        works, note = self.grad_scaler
        rows.append(("GradScaler", ("available" if works else "not available") + f" ({note})"))
        if self.float32_settings:
            rows.append(("float32 precision", float32_settings_text(self.float32_settings)))
        if not self.is_gpu:
            rows.append(("CPU BF16 instructions", yes_no[self.cpu_native_bf16]))
        rows.append(("seed", str(self.seed)))
        return rows

    def summary_line(self) -> str:
        dtypes = ", ".join(dtype_name(d) for d in self.autocast_dtypes) or "none"
        where = (
            self.device_name
            if self.is_gpu
            else (
                "CPU only (no GPU visible): each value rounds as it would on a GPU, but op results can differ "
                "from a "
                "GPU's in the last bits, and speed-ups are not measured here"
            )
        )
        return f"Running on {self.device} ({where}); autocast dtypes that work here: {dtypes}."

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        lines = ["Environment card", "-" * 16]
        lines += [f"{k.ljust(width)} : {v}" for k, v in self.rows()]
        lines.append(self.summary_line())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left;padding:2px 10px'>{html.escape(k)}</th>"
            f"<td style='text-align:left;padding:2px 10px'>{html.escape(v)}</td></tr>"
            for k, v in self.rows()
        )
        colour = "#2e7d32" if self.is_gpu else "#1565c0"
        return (
            f"<div style='border:2px solid {colour};border-radius:6px;padding:8px;max-width:900px'>"
            f"<b>Environment card</b><table>{body}</table>"
            f"<div style='margin-top:4px'>{html.escape(self.summary_line())}</div></div>"
        )


def describe(device: torch.device, seed: int = 0) -> Environment:
    """Build the environment card for ``device`` by probing it."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine() or "CPU"
    autocast = {}
    for dtype in AUTOCAST_DTYPES:
        autocast[dtype_name(dtype)] = probe_autocast(device, dtype)
    return Environment(
        device=device,
        device_name=device_name,
        torch_version=torch.__version__,
        python_version=platform.python_version(),
        seed=seed,
        cuda_version=torch.version.cuda,
        hip_version=getattr(torch.version, "hip", None),
        autocast=autocast,
        grad_scaler=probe_grad_scaler(device),
        cpu_native_bf16=cpu_has_native_bf16() if device.type == "cpu" else None,
        threads=torch.get_num_threads(),
        float32_settings=float32_matmul_settings(),
    )


def setup(seed: int = 0) -> Environment:
    """Seed everything, pick the device and return the environment card (display it to see it).

    Every lesson starts with ``env = setup()`` and then uses ``env.device``, so the same code runs on a
    laptop CPU and on a GPU.
    """
    env = describe(pick_device(), seed)
    seed_everything(seed)  # after the probes, so nothing they do can shift the random streams a lesson sees
    return env
