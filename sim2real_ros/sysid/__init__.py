"""System identification of the actual unit: excite, record, fit, calibrate the simulator."""
