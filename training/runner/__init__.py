"""The training runner: the program inside the trainer container (no Django, no gpubook
imports; only the standard library, Ultralytics and torch, imported lazily). See cli.py."""
