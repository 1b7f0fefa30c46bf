"""Machinery several methods share, each module named for what it holds: the confident-view selection
(confidence.py), the online methods' state checks (online_common.py), the classic norm-adaptation methods
(norm_config.py, norm_adaptation.py), and each family's machinery: prompt tuning (prompt_tuning_config.py,
prompt_tuning.py), TDA's caches (tda_cache_config.py, tda_cache.py), DMN's memory (dmn_memory.py), CLIPArTT's
pseudo-labels and loss (clipartt_pseudo_labels.py). No method folder imports another's: what two share is here
(tests/test_layering.py)."""
