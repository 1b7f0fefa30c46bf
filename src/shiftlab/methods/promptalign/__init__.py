"""PromptAlign: test-time tuning of MaPLe prompts with token-statistics alignment (NeurIPS 2023)."""
