"""Adapters between the graph's contract topics and what a cell's controllers speak."""
