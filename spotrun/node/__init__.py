"""Each VM: the node agent, its launcher supervision, the cloud's preemption notices."""
