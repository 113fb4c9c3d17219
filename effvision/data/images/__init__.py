"""Images: decoding, ImageFolder folders and zips, the embedded digits, transforms, CIFAR-10 preparation."""
