"""Costs, memory and the step: the Plan and framework profiles, calibration profiles, one layer's and one stage's costs, memory per rank, offload, the one composition of a step."""
