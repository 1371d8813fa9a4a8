"""The pure learning code: the MLP, its optimizer, the step and epoch functions, device batches."""
