"""Models and their accounting."""
