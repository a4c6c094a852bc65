"""Lesson 09 helpers: ranks started from Python and with torchrun always end (a hung rank is killed, a
failed one is reported with its last words), learner functions travel to spawned ranks, the recipe's
slices add up to the single-process batch, and the doctor's probe works here."""

import multiprocessing
import os
import pickle
import sys
import textwrap
import time

import pytest
import torch

from amp_lessons.l09_amp_across_processes import across_ranks, distributed
from amp_lessons.l09_amp_across_processes.distributed import DistributedRunError, PortableFunction, run_ranks
from amp_lessons.l09_amp_across_processes.workers import amp_ranks

# ------------------------------------------------------------------------------- tasks (module level)


def sum_of_ranks(rank, world_size):
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return float(value)


def rank1_raises(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 has a bad batch")
    return "fine"


def rank1_aborts(rank, world_size):
    if rank == 1:
        os.abort()
    return "fine"


def prints(rank, world_size):
    print(f"hello from rank {rank}")
    return rank


def calls_learner(rank, world_size, fn):
    return fn(rank)


def learner_function(rank):
    import torch.distributed as dist

    value = torch.ones(2) * (rank + 1)
    dist.all_reduce(value)
    return value.tolist()


# ------------------------------------------------------------------------------------------- run_ranks


def test_loopback_interface_is_found_on_linux():
    if sys.platform.startswith("linux"):
        assert distributed.loopback_interface() == "lo"


def test_torchrun_command_is_the_standalone_two_process_launch():
    command = distributed.torchrun_command(
        "amp_lessons.l09_amp_across_processes.workers.probe", ["--out", "x"]
    )
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in command and "--nproc-per-node=2" in command
    assert command[-4:] == ["-m", "amp_lessons.l09_amp_across_processes.workers.probe", "--out", "x"]
    assert distributed.shown_command(command).startswith("torchrun --standalone")


def test_two_ranks_all_reduce():
    result = run_ranks(sum_of_ranks)
    assert result.ok, result.describe()
    assert result.values == [3.0, 3.0]
    assert result.method == distributed.start_method()


def test_an_exception_in_one_rank_is_reported_with_its_traceback():
    result = run_ranks(rank1_raises)
    assert [o.status for o in result.outcomes] == ["ok", "error"]
    assert "ValueError: rank 1 has a bad batch" in result.outcomes[1].error
    assert "rank 1: error (ValueError: rank 1 has a bad batch)" in result.describe()


def test_a_crashed_rank_is_reported_by_its_signal():
    result = run_ranks(rank1_aborts)
    assert result.outcomes[0].status == "ok"
    assert result.outcomes[1].status == "crashed"
    assert "SIGABRT" in result.outcomes[1].error


def test_printed_output_stays_with_the_rank(capsys):
    result = run_ranks(prints)
    assert [o.output.strip() for o in result.outcomes] == ["hello from rank 0", "hello from rank 1"]
    assert "hello" not in capsys.readouterr().out


def test_a_stuck_rank_is_killed_and_its_partner_times_out():
    started = time.perf_counter()
    result = run_ranks(distributed.stuck_rank_demo, timeout_s=2, collective_timeout_s=1)
    assert time.perf_counter() - started < 8
    rank0, rank1 = result.outcomes
    assert rank0.status == "error" and "Timed out" in rank0.error
    assert rank1.status == "timeout"
    assert not multiprocessing.active_children()  # every rank has ended


def _uses_a_global(x, *, factor=2):
    return float(torch.tensor(float(x)) * factor)


def test_portable_function_travels_by_value():
    """Code, defaults and the modules it names travel; the copy no longer needs this test module."""
    copy = pickle.loads(pickle.dumps(PortableFunction(_uses_a_global)))
    assert copy(3) == 6.0 and copy(3, factor=3) == 9.0
    assert copy.__globals__["__name__"] == "learner"


def test_a_closure_cannot_travel_and_says_so():
    factor = 2

    def closure(x):
        return x * factor

    copy = pickle.loads(pickle.dumps(PortableFunction(closure)))
    with pytest.raises(RuntimeError, match="closure"):
        copy(1)


def test_spawned_ranks_run_a_learner_function():
    """The path macOS and Windows take: fresh processes, the learner's function sent by value."""
    result = run_ranks(calls_learner, learner_function, method="spawn", start_timeout_s=90)
    assert result.ok, result.describe()
    assert result.values == [[3.0, 3.0], [3.0, 3.0]]


# ---------------------------------------------------------------------------------------------- launch


HUNG_RUN = textwrap.dedent("""
    import os, subprocess, sys, time
    out = sys.argv[1]
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    open(os.path.join(out, "pid.rank0"), "w").write(str(worker.pid))
    open(os.path.join(out, "worker.pid"), "w").write(str(worker.pid))
    time.sleep(120)
""")

FAILED_RUN = textwrap.dedent("""
    import os, sys
    out = sys.argv[1]
    with open(os.path.join(out, "error.rank1.txt"), "w") as handle:
        handle.write("Traceback ...\\nValueError: rank 1 has a bad batch\\n")
    sys.exit(1)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/status") as handle:
            return "\nState:\tZ" not in handle.read()
    except OSError:
        return True


@pytest.mark.skipif(os.name == "nt", reason="process sessions are POSIX")
def test_launch_kills_a_hung_run_and_its_workers(tmp_path):
    started = time.perf_counter()
    with pytest.raises(DistributedRunError, match="did not finish within 3 s and was killed"):
        distributed.launch(
            "unused",
            out_dir=str(tmp_path),
            timeout_s=3,
            command=[sys.executable, "-c", HUNG_RUN, str(tmp_path)],
        )
    assert time.perf_counter() - started < 15
    worker = int((tmp_path / "worker.pid").read_text())
    time.sleep(0.2)
    assert not _alive(worker)


STUCK_RANK = textwrap.dedent("""
    import sys, time
    from amp_lessons.l09_amp_across_processes.distributed import start_rank
    start_rank(sys.argv[1], 1.0)
    def wait_for_a_partner_that_never_comes():
        time.sleep(60)
    wait_for_a_partner_that_never_comes()
""")


def test_a_rank_past_its_deadline_says_where_it_was_stuck(tmp_path):
    started = time.perf_counter()
    with pytest.raises(DistributedRunError) as error:
        distributed.launch(
            "unused",
            out_dir=str(tmp_path),
            timeout_s=30,
            command=[sys.executable, "-c", STUCK_RANK, str(tmp_path)],
        )
    assert time.perf_counter() - started < 20
    assert "rank 0: still running at its deadline, stuck in File" in str(error.value)
    assert "wait_for_a_partner_that_never_comes" in str(error.value)


def test_launch_reports_a_failed_rank(tmp_path):
    with pytest.raises(DistributedRunError) as error:
        distributed.launch(
            "unused",
            out_dir=str(tmp_path),
            timeout_s=60,
            command=[sys.executable, "-c", FAILED_RUN, str(tmp_path)],
        )
    text = str(error.value)
    assert "failed with exit code 1" in text
    assert "rank 1: Traceback ... | ValueError: rank 1 has a bad batch" in text
    assert "rank 0: left no error message" in text


def test_can_start_process_group_both_ways():
    ok, message = distributed.can_start_process_group(timeout_s=90)
    assert ok, message
    assert "torchrun" in message and "from Python" in message


def test_the_doctor_probe_fails_cleanly_when_torchrun_cannot_start(monkeypatch):
    def broken_launch(*args, **kwargs):
        raise DistributedRunError("The torchrun run failed with exit code 1 after 0.1 s.")

    monkeypatch.setattr(distributed, "launch", broken_launch)
    ok, message = distributed.can_start_process_group(timeout_s=30)
    assert not ok
    assert message.startswith("torchrun could not start 2 ranks")


# ------------------------------------------------------------------------------------ recipe and worker


def test_rank_slices_make_up_the_single_process_batch():
    for step in (0, 7, 59):
        whole = across_ranks.step_rows(step)
        halves = [across_ranks.step_rows(step, rank, 2) for rank in range(2)]
        assert torch.equal(torch.cat(halves), whole)
        assert len(set(halves[0].tolist()) & set(halves[1].tolist())) == 0


def test_the_spike_overflows_float16_only_where_it_is_meant_to():
    inputs = torch.zeros(2, 16)
    spiked = across_ranks.spike_inputs(inputs, torch.float16)
    assert torch.isfinite(spiked).all() and not torch.isfinite(spiked.half()).all()
    assert torch.isinf(across_ranks.spike_inputs(inputs, torch.bfloat16)).any()
    assert torch.equal(inputs, torch.zeros(2, 16))  # the caller's batch is not changed


def test_reducing_in_bfloat16_loses_more_with_more_ranks():
    errors = across_ranks.simulated_reduction_error(ranks_counts=(2, 16, 128), numel=4000)
    assert errors["bfloat16"].is_monotonic_increasing
    assert (errors["float32"] < 1e-6).all() and (errors["bfloat16"] > 1e-4).all()


def test_single_process_run_reports_steps_and_scores():
    run = across_ranks.single_process_run(torch.device("cpu"), torch.bfloat16, steps=3)
    assert len(run["losses"]) == len(run["seconds"]) == 3
    assert run["scores"].shape == (256, 4) and run["scores"].dtype == torch.float32
    assert run["skipped"] == []  # bfloat16: the scaler is disabled


def test_worker_skips_fsdp_before_torch_2_6(monkeypatch):
    monkeypatch.setattr(amp_ranks, "torch_version_tuple", lambda: (2, 5))
    section = amp_ranks.fsdp_section(ctx=None)
    assert "torch 2.6 or newer" in section["skipped"]


def test_worker_uses_gloo_without_a_gpu_per_rank(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_DEVICE", "cpu")
    assert amp_ranks.choose_backend(2) == "gloo"
    assert across_ranks.rank_device(2) == torch.device("cpu")


def test_too_little_memory_is_refused_with_a_message_before_anything_starts(monkeypatch, tmp_path):
    """Binder gives about 2 GB: two fresh ranks would get the kernel killed, so launch refuses and says why."""
    assert distributed.memory_problem(2, free=4 * 2**30) == ""
    assert distributed.memory_problem(2, free=None) == ""  # unknown: do not guess
    message = distributed.memory_problem(2, free=600 * 2**20)
    assert "600 MiB free" in message and "Binder" in message
    monkeypatch.setattr(distributed, "free_memory_bytes", lambda: 300 * 2**20)
    started = []
    monkeypatch.setattr(distributed.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(distributed.DistributedRunError, match="Not enough memory to start 2 ranks"):
        distributed.launch("amp_lessons.l09_amp_across_processes.workers.probe", out_dir=str(tmp_path))
    assert started == []


def test_free_memory_is_read_here():
    free = distributed.free_memory_bytes()
    assert free is None or free > 0
