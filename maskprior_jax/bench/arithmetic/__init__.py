"""The low-data arithmetic benchmark: tasks, splits and the structure prior (`tasks`), the runner (`run`)."""
