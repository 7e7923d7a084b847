"""The paper-GPU cost model: hardware, counting FLOPs and bytes, step time (the roofline)."""
