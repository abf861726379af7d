"""Shared rclpy helpers: QoS profiles, message <-> numpy, parameters from a schema, diagnostics."""
