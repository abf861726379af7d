"""The arm as the URDF describes it: joint names, limits, inertials, kinematics."""

from sim2real_ros.robot.model import ArmModel, JointLimits, load_arm

__all__ = ["ArmModel", "JointLimits", "load_arm"]
