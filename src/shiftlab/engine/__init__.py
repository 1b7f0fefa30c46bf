"""The engine: a run's configuration (`config.py`), its loop (`loop.py`) around the one engine step
(`step.py`), the feature store's use by a run (`features.py`), suites (`suite.py`), torchrun
(`distributed.py`, `planning.py`) and interrupts (`interrupt.py`)."""
