"""Infrastructure around the pipeline: process groups (`distributed`), work planning (`planning`),
online-state checkpoints (`online_state`) and the run directory's lock (`lock`)."""
