"""TAPT: test-time adversarial prompt tuning of deep visual prompts (CVPR 2025)."""
