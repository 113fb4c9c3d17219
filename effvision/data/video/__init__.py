"""Video: decoding (decord, PyAV), clip datasets, frame samplers, transforms, test-time views,
generated motion clips."""
