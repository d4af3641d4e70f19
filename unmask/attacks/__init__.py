"""Attacks on real pretrained models: recover their input from what they expose."""
