"""Chat completions: prompt composition, web augmentation, output filters, the engine call."""
