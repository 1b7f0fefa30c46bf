"""HisTPT (Zhang et al., NeurIPS 2024), online prompt tuning with three memory banks, as TTABC runs it."""
