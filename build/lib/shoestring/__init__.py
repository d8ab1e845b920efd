"""shoestring: train the best language model a compute budget allows."""

__version__ = "0.1.0"
