"""Lesson 09: the scripts ``torchrun`` starts, one process per rank.

``python -m torch.distributed.run --standalone --nproc-per-node 2 -m amp_lessons.l09_amp_across_processes.workers.<name> ...`` runs
``<name>.main()`` in each of two fresh processes; ``amp_lessons.l09_amp_across_processes.distributed.launch`` builds that command,
waits for it with a hard timeout and reads back what each rank saved.
"""
