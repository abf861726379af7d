"""sim2real_ros: take a robot-arm policy trained in simulation and harden it for a physical cell."""

__version__ = "0.1.0"
