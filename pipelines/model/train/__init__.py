"""Training the GEM-style model: the loop (:mod:`.loop`), its count baseline, metrics and data split.

Kept apart from the model's modules and inputs so that inference (precompute,
streaming refresh) never imports the trainer.
"""
