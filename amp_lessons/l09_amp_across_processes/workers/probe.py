"""Lesson 09: the smallest torchrun worker: join the process group, all-reduce one number, report it.

``amp_lessons.l09_amp_across_processes.distributed.can_start_process_group`` (and so ``python -m amp_lessons doctor``) runs it to see
whether two local processes can form a gloo group on this machine.
"""

from __future__ import annotations

import argparse
import datetime


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline", type=float, default=60.0)
    args = parser.parse_args(argv)

    from amp_lessons.l09_amp_across_processes.distributed import report_failure, save_rank, start_rank

    start_rank(args.out, args.deadline)
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=max(5.0, args.deadline / 2)))
        value = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(value)
        save_rank(args.out, {"sum": float(value), "world_size": dist.get_world_size()})
    except BaseException:
        report_failure(args.out)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
