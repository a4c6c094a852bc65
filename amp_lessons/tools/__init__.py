"""The command-line tools: ``python -m amp_lessons <command>`` (cli), exercise builder, grade, doctor,
progress."""
