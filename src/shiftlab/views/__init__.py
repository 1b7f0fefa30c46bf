"""Views: a method's view recipe (`recipe.py`, data without torch), the seeded view generator and
AugMix (`generator.py`), and what a model expects of its input (`preprocess.py`)."""
