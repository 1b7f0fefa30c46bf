"""The run directory on disk: records and their files, the run's identity (run.json), its lock,
online state, probability vectors, the stream order, and the feature store."""
