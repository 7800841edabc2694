"""Measured forward-cost profiles kept on disk for the decoder (`store.py`)."""
