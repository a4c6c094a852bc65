"""What two or more lessons, the checkers' harness or the tools share; nothing here has a lesson number.

- ``environment``: seeding, device choice, the environment card, thread control (``amp_lessons.setup``)
- ``models``, ``data``: the small models and fixed datasets the lessons train and break
- ``quiz``: end-of-lesson quizzes (each lesson's questions are data, ``amp_lessons/lNN_*/quiz.json``)
- ``record``: the learner's progress record
- ``autocast_state``: is autocast on, in which dtype; ``OpDtypeRecorder`` (which dtype each op ran in)
- ``display``: ``short_table``/``ShortTable``, ``scale_text``
- ``files``: ``atomic_write``, ``repo_root``
- ``processes``: ``tagged_processes``
- ``cuda_labelled``: CPU tensors that report a CUDA device, so checks see what learner code does on a GPU
  (lessons 00, 03 and 08)
- ``optional_libraries``: ``torchao_support``/``library_support``: does torchao (transformers, lightning) import on
  this torch, and if not, the one-line reason a lesson prints when it skips a section (lessons 10-12, doctor)

Nothing is imported here, so importing one core module never loads the others (or torch).
"""
