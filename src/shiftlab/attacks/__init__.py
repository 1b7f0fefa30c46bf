"""Threat models for robust accuracy: the attack registry (`--attack NAME`) and L-inf PGD."""
from .base import QUANTIZE_MODES, Attack, attack_seed, build_attack, eps_255, list_attacks, quantize, register_attack
from .pgd_linf import PGDAttack, ZeroShotClassifier, pgd

__all__ = ["QUANTIZE_MODES", "Attack", "PGDAttack", "ZeroShotClassifier", "attack_seed", "build_attack", "eps_255",
           "list_attacks", "pgd", "quantize", "register_attack"]
