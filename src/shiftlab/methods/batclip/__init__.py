"""BATCLIP: the norm layers of both CLIP towers adapted per batch on entropy and two prototype losses."""
