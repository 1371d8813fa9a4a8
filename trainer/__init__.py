"""The run machinery: devices, the loop, checkpoints, preemption, processes, the reporter."""
