"""Builders of models to run the registry on: the demo pair trained here (demo_pair.py), its
EAGLE-3, Medusa and MTP heads (demo_heads.py, demo_medusa.py, demo_mtp.py) and the real SmolLM2
pair (real_pair.py). They make models with the runtime's classes and save them as real checkpoints
ship; the runtime never imports them (docs/design.md §1). Each imports torch lazily.
"""
