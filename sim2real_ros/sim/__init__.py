"""Simulation backend: PyBullet plant, randomization, actuator/latency/sensor models, bridge."""
