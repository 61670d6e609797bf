"""Framework integrations: ``hf`` (transformers TrainerCallback), ``lightning`` (Callback)."""
