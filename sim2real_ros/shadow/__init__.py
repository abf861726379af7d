"""Shadow mode and phased rollout: divergence metrics, rollout gates, the stage machine, report."""
