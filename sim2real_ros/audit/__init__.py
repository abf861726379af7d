"""The reality-gap audit: name each gap from evidence, and refuse to deploy on red.

`evidence` turns the other rooms' files (randomization spec, calibrations, bags, the safety
suite's fault record, hardware-in-the-loop run records) into typed evidence; `checklist` applies
the six rules; `latency` measures the observation-to-action latency of a graph or a bag;
`worldmodel` is the learned second simulator used as a consistency check; `cli` is
`sim2real audit`.
"""
