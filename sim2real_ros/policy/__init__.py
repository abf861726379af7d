"""Policies: the reaching task, an ensemble MLP with uncertainty, training, a versioned registry.

Pure modules (task, model, runner, registry, train, finetune) import no rclpy; `node.py` and
`task_node.py` are the thin ROS 2 nodes over them.
"""
