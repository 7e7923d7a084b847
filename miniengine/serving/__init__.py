"""Serving: request metrics, workloads and the simulator on the cost model's clock, disaggregation."""
