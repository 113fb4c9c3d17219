"""Point clouds: readers (OFF, PCD, PLY, bin), datasets, point samplers, transforms, batches, generated shapes."""
