"""The Boolean extrapolation (GOTU) benchmark: tasks and their analysis (`tasks`), the runner (`run`)."""
